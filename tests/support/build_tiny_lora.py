"""Build a tiny random LoRA adapter for the tiny Llama that the real vLLM CPU server serves.

Run by ``lora_adapter.build_adapter`` with the vLLM virtualenv's python (it needs torch and
safetensors, which the project's virtualenv does not have): ``python build_tiny_lora.py OUT_DIR``.
A PEFT adapter as vLLM loads it: ``adapter_config.json`` and ``adapter_model.safetensors`` with
rank-8 A and B matrices for ``q_proj`` and ``v_proj`` of both layers. No download, fixed seed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEED = 0
RANK = 8
HIDDEN_SIZE = 128  # build_tiny_model.py: hidden_size
LAYERS = 2  # build_tiny_model.py: num_hidden_layers
PROJECTION_SIZE = 128  # q_proj and v_proj: 2 heads (2 key-value heads) of 64
TARGET_MODULES = ("q_proj", "v_proj")


def build(out_dir: Path) -> None:
    """Write the adapter's config and bf16 safetensors weights into ``out_dir``."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    tensors = {}
    for layer in range(LAYERS):
        for module in TARGET_MODULES:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, HIDDEN_SIZE).to(torch.bfloat16) / 16
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(PROJECTION_SIZE, RANK).to(torch.bfloat16) / 16
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGET_MODULES),
        "base_model_name_or_path": "tiny",
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=1) + "\n")


if __name__ == "__main__":
    build(Path(sys.argv[1]))
