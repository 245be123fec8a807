"""The served model's tokenizer for a template check, and its chat template.

``gpt2`` is the bundled GPT-2 byte-level BPE with the tiny model's ChatML template (app/domain/gpt2.py:
the ids of the vLLM CPU server's model). Otherwise a path, absolute or in the repository's work tree:
a Hugging Face ``tokenizer.json``, or a model folder holding one and its chat template
(``chat_template.jinja``, or ``chat_template`` in ``tokenizer_config.json``, as transformers saves
them), which renders chat templates' prompts as vLLM renders them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from app.domain import gpt2
from app.domain.templatecheck.config import BUNDLED_TOKENIZER

ChatRender = Callable[[Sequence[Mapping[str, str]]], str]


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer (app/domain/templatecheck/analysis.py's protocol) and its chat template."""

    name: str
    tokenizer: Tokenizer
    chat: ChatRender

    def encode_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [(list(e.ids), [start for start, _ in e.offsets]) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def wrap(self, text: str, context: Mapping[str, Any], *, user: str | None) -> str:
        """A chat template's prompt: the render as the system message, then the ``user`` variable's
        value as the user message when one is named, and the assistant's header."""
        messages = [{"role": "system", "content": text}]
        if user is not None:
            messages.append({"role": "user", "content": str(context.get(user, ""))})
        return self.chat(messages)


def load_tokenizer(name: str, *, root: Path | None) -> LoadedTokenizer:
    """The tokenizer ``name`` names. Raises OSError (no such file) or ValueError (not a tokenizer)."""
    if name == BUNDLED_TOKENIZER:
        return LoadedTokenizer("gpt2 (bundled, the vLLM CPU fixture's)", gpt2.tokenizer(), gpt2.render_chat)
    path = Path(name)
    if not path.is_absolute():
        if root is None:
            raise ValueError("a relative tokenizer path needs a work tree: give an absolute path or `gpt2`")
        path = root / path
    folder = path if path.is_dir() else path.parent
    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 (the tokenizers library raises a bare Exception)
        if not file.exists():
            raise OSError(f"{file} does not exist") from None
        raise ValueError(f"{file} is not a Hugging Face tokenizer.json: {exc}") from None
    return LoadedTokenizer(str(path), tokenizer, _chat_template(folder))


def _chat_template(folder: Path) -> ChatRender:
    """The folder's chat template rendered as Hugging Face renders it; the bundled ChatML without one."""
    config = folder / "tokenizer_config.json"
    settings = json.loads(config.read_text(encoding="utf-8")) if config.exists() else {}
    file = folder / "chat_template.jinja"
    source = file.read_text(encoding="utf-8") if file.exists() else settings.get("chat_template")
    if not isinstance(source, str):
        return gpt2.render_chat
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise
    template = environment.from_string(source)
    special = {key: _token(settings.get(key)) for key in ("bos_token", "eos_token")}
    return lambda messages: template.render(messages=list(messages), add_generation_prompt=True, **special)


def _token(value: object) -> str:
    if isinstance(value, Mapping):
        return str(value.get("content", ""))
    return str(value or "")


def _raise(message: str) -> None:
    raise TemplateError(message)
