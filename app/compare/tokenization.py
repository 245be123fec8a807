"""Prompts into token ids, as the server sees them when it can be asked; and token ids back into text.

Text and chat messages go to the ``/tokenize`` endpoint of a registered server of the chosen
model (vLLM applies the model's own chat template there), trying a few of them with a short
timeout; when none answers, the local tokenizer tokenizes them and the result carries a warning
that says so: the file named by PREFIXSCOPE_TOKENIZER_FILE (a Hugging Face ``tokenizer.json``, or
a tiktoken BPE file split by PREFIXSCOPE_TOKENIZER_PATTERN), else the bundled GPT-2 tokenizer
(``app.domain.gpt2``, offline). Token ids pass through as given. ``Detokenizer`` goes the other way
(the ``/detokenize`` endpoint, else the same local tokenizer).
Never logs prompt text.
"""

import base64
import binascii
import json
import logging
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

import httpx
import tiktoken
from django.conf import settings
from tokenizers import Tokenizer

from app.domain import gpt2 as bundled
from app.fleet.models import Server
from collectors.tokenize.client import DetokenizeFailed, TokenizeFailed, fetch_text, fetch_tokens

logger = logging.getLogger(__name__)

BUNDLED_TOKENIZER: Final = "bundled GPT-2 (offline)"
BUNDLED_TOKENIZER_NAME: Final = "gpt2 (bundled)"
"""The compatibility record's ``tokenizer`` for the bundled tokenizer; a server's is its model."""
GIVEN_TOKEN_IDS: Final = "token ids as given"
TIMEOUT_SECONDS: Final = 2.0
MAX_SERVERS_TRIED: Final = 3
MAX_TOKEN_ID: Final = 2**31 - 1  # token ids are stored in int4 columns, like a request record's

PromptFormat = Literal["auto", "text", "chat", "token_ids"]


class PromptError(ValueError):
    """A prompt that cannot be read in the format asked for; the message says why."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt as a person or a script gives it: exactly one of text, chat messages or token ids."""

    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if sum(value is not None for value in (self.text, self.messages, self.token_ids)) != 1:
            raise PromptError("a prompt is one of text, chat messages or token ids")

    @property
    def source(self) -> str:
        """``text``, ``chat`` or ``token_ids`` (the values of ComparisonSide.Source)."""
        return "text" if self.text is not None else "chat" if self.messages is not None else "token_ids"


@dataclass(frozen=True, slots=True)
class Tokenized:
    """A prompt's token ids and who made them.

    ``token_strs``: each token's vocabulary string as the tokenizer gave it, or None (then the
    page looks the ids up in the bundled vocabulary). ``tokenizer``: the value for the
    compatibility record (the model, whose tokenizer the server uses, or the bundled one's
    name; None for token ids given as such). ``warning``: why the ids may not be the server's.
    """

    token_ids: list[int]
    token_strs: list[str] | None
    tokenizer_used: str
    tokenizer: str | None
    server: Server | None
    warning: str = ""


def parse_prompt(raw: str, prompt_format: PromptFormat = "auto") -> Prompt:
    """Read a prompt typed or pasted into a form.

    ``chat``: a JSON list of ``{"role", "content"}`` messages with string values; ``token_ids``:
    a JSON list of integers (commas or spaces without brackets also do); ``text``: as is.
    ``auto`` takes JSON that reads as messages or token ids as such, anything else as text.
    Raises PromptError naming what is wrong.
    """
    if prompt_format == "text":
        return Prompt(text=raw)
    if prompt_format == "chat":
        return Prompt(messages=_messages(_json(raw)))
    if prompt_format == "token_ids":
        stripped = raw.strip()
        data = _json(stripped if stripped.startswith("[") else "[" + ",".join(stripped.split()) + "]")
        return Prompt(token_ids=_token_ids(data))
    try:
        data = json.loads(raw)
    except ValueError:
        return Prompt(text=raw)
    # A JSON list of objects or of integers was meant as messages or ids: say what is wrong with it.
    if isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        return Prompt(messages=_messages(data))
    if isinstance(data, list) and data and all(isinstance(item, int) for item in data):
        return Prompt(token_ids=_token_ids(data))
    return Prompt(text=raw)


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise PromptError(f"not valid JSON: {exc}") from None


def _messages(data: Any) -> tuple[Mapping[str, str], ...]:
    if not isinstance(data, list) or not data:
        raise PromptError("chat messages are a non-empty JSON list of {role, content} objects")
    for number, message in enumerate(data, start=1):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptError(f"message {number} needs a string 'role'")
        if not isinstance(message.get("content"), str):
            raise PromptError(f"message {number} needs a string 'content' (content parts are not supported)")
    return tuple({"role": message["role"], "content": message["content"]} for message in data)


def _token_ids(data: Any) -> tuple[int, ...]:
    if not isinstance(data, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) for item in data
    ):
        raise PromptError("token ids are a JSON list of integers")
    if any(not 0 <= item <= MAX_TOKEN_ID for item in data):
        raise PromptError(f"token ids are between 0 and {MAX_TOKEN_ID}")
    return tuple(data)


def tokenizing_servers(*, server: Server | None, model: str) -> list[Server]:
    """The servers to ask, in order: the chosen one, then others of its (or the chosen) model.

    Active servers come before servers whose last scrape failed; disabled servers and servers
    without a base URL are never asked. At most MAX_SERVERS_TRIED.
    """
    model = server.model if server is not None and server.model else model
    candidates = [server] if server is not None and server.base_url else []
    if model:
        others = (
            Server.objects.filter(model=model)
            .exclude(base_url="")
            .exclude(state=Server.State.DISABLED)
            .order_by("state", "name")  # "active" sorts before "down" and "proposed"
        )
        candidates += [other for other in others if server is None or other.pk != server.pk]
    return candidates[:MAX_SERVERS_TRIED]


def tokenize_prompts(
    prompts: Sequence[Prompt], *, server: Server | None, model: str, client: httpx.Client | None = None
) -> list[Tokenized]:
    """Tokenize every prompt with one tokenizer: the first listed server (``tokenizing_servers``)
    that answers for all of them, else the bundled one, with a warning naming what was tried.
    Token ids pass through untouched; when all prompts are token ids, no server is asked.
    """
    if all(prompt.token_ids is not None for prompt in prompts):
        return [_given(prompt) for prompt in prompts]
    failures = []
    with nullcontext(client) if client is not None else httpx.Client() as http:
        for candidate in tokenizing_servers(server=server, model=model):
            try:
                return [_via_server(prompt, candidate, http) for prompt in prompts]
            except TokenizeFailed as exc:
                logger.info("tokenize on %s failed: %s", candidate.name, exc.reason)
                failures.append(f"{candidate.name}: {exc.reason}")
    model = server.model if server is not None and server.model else model
    chat = any(prompt.messages is not None for prompt in prompts)
    warning = _fallback_warning(model, failures, chat=chat)
    return [_bundled(prompt, warning) for prompt in prompts]


def _via_server(prompt: Prompt, server: Server, client: httpx.Client) -> Tokenized:
    if prompt.token_ids is not None:
        return _given(prompt)
    # No "model": the server tokenizes for its base model, and a name that differs (a registered
    # alias) would only earn a 404. vLLM's defaults for special tokens match its completions.
    body: dict[str, Any] = {"return_token_strs": True}
    if prompt.messages is not None:
        body |= {"messages": [dict(message) for message in prompt.messages], "add_generation_prompt": True}
    else:
        body["prompt"] = prompt.text
    tokens, strs = fetch_tokens(client, server.base_url, body, timeout_seconds=TIMEOUT_SECONDS)
    return Tokenized(tokens, strs, f"server {server.name} /tokenize", server.model or None, server)


def _bundled(prompt: Prompt, warning: str) -> Tokenized:
    if prompt.token_ids is not None:
        return _given(prompt)
    text = bundled.render_chat(prompt.messages) if prompt.messages is not None else prompt.text or ""
    if path := settings.PREFIXSCOPE_TOKENIZER_FILE:
        ids, strs = local_tokenizer(path, settings.PREFIXSCOPE_TOKENIZER_PATTERN).encode(text)
        name = Path(path).name
        return Tokenized(ids, strs, f"local {name}", f"local:{name}", None, warning)
    tokens = bundled.encode(text)
    return Tokenized(tokens, None, BUNDLED_TOKENIZER, BUNDLED_TOKENIZER_NAME, None, warning)


class LocalTokenizer:
    """A configured tokenizer file: a Hugging Face tokenizer.json, or tiktoken's BPE ranks."""

    def __init__(self, path: str, pattern: str) -> None:
        data = Path(path).read_bytes()
        self._hugging_face: Tokenizer | None = None
        self._tiktoken: tiktoken.Encoding | None = None
        if data.lstrip().startswith(b"{"):
            self._hugging_face = Tokenizer.from_str(data.decode("utf-8"))
        else:
            ranks = _tiktoken_ranks(data, path)
            self._tiktoken = tiktoken.Encoding(Path(path).name, pat_str=pattern, mergeable_ranks=ranks,
                                               special_tokens={})  # fmt: skip

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        """The token ids of `text` and each token's string."""
        if self._hugging_face is not None:
            encoding = self._hugging_face.encode(text, add_special_tokens=False)
            return list(encoding.ids), list(encoding.tokens)
        assert self._tiktoken is not None
        ids = self._tiktoken.encode_ordinary(text)
        strs = [piece.decode("utf-8", "replace") for piece in self._tiktoken.decode_tokens_bytes(ids)]
        return ids, strs

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (special tokens kept, as vLLM's /detokenize keeps them)."""
        if self._hugging_face is not None:
            return self._hugging_face.decode(list(token_ids), skip_special_tokens=False)
        assert self._tiktoken is not None
        return self._tiktoken.decode(list(token_ids), errors="replace")


def _tiktoken_ranks(data: bytes, path: str) -> dict[bytes, int]:
    """The `<base64 token> <rank>` lines of a .tiktoken file. Read here rather than with
    tiktoken.load, which caches a local file's contents by its path in the temp folder and so
    would keep using an old copy of a file replaced in place."""
    ranks = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise ValueError(
                f"{path}, line {number}: not a tokenizer.json nor a tiktoken rank line"
            ) from None
    return ranks


@cache
def local_tokenizer(path: str, pattern: str) -> LocalTokenizer:
    """The configured tokenizer file, loaded once per process."""
    return LocalTokenizer(path, pattern)


def _given(prompt: Prompt) -> Tokenized:
    return Tokenized(list(prompt.token_ids or ()), None, GIVEN_TOKEN_IDS, None, None)


def _fallback_warning(model: str, failures: Sequence[str], *, chat: bool) -> str:
    if failures:
        why = f"No server of model {model!r} answered /tokenize ({'; '.join(failures)})"
    elif model:
        why = f"No registered server serves model {model!r}"
    else:
        why = "No server or model was chosen"
    warning = (
        f"{why}: tokenized by the {_local_name()} tokenizer, not the server's; "
        "the token ids may differ from those vLLM sees."
    )
    if chat:
        warning += " Chat messages were rendered with the bundled ChatML template, not the model's."
    return warning


def _local_name() -> str:
    path = settings.PREFIXSCOPE_TOKENIZER_FILE
    return f"local {Path(path).name}" if path else BUNDLED_TOKENIZER


def vocabulary_strs(token_ids: Sequence[int]) -> list[str]:
    """Each id's string in the bundled GPT-2 vocabulary (``"Ġthe"``); ``⟨id⟩`` for ids outside it."""
    size = bundled.vocab_size()
    known = bundled.token_strs([t for t in token_ids if 0 <= t < size])
    strs = iter(known)
    return [next(strs) if 0 <= t < size else f"⟨{t}⟩" for t in token_ids]


class Detokenizer:
    """Token ids into text for one model: the ``/detokenize`` of the servers ``tokenizing_servers``
    lists (one that fails is not asked again), else the configured tokenizer file, else the bundled
    GPT-2 tokenizer. Called as a function (a ``Decode``); a context manager for its HTTP client.
    ``used`` says what decoded the last call. Never logs the text.
    """

    def __init__(self, *, server: Server | None, model: str, client: httpx.Client | None = None) -> None:
        self._servers = tokenizing_servers(server=server, model=model)
        self._own_client = client is None and bool(self._servers)
        self._client = client if client is not None else httpx.Client() if self._servers else None
        self.used = ""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._own_client and self._client is not None:
            self._client.close()

    def __call__(self, token_ids: Sequence[int]) -> str:
        while self._servers and self._client is not None:
            server = self._servers[0]
            try:
                text = fetch_text(self._client, server.base_url, token_ids, timeout_seconds=TIMEOUT_SECONDS)
            except DetokenizeFailed as exc:
                logger.info("detokenize on %s failed: %s", server.name, exc.reason)
                self._servers.pop(0)
            else:
                self.used = f"server {server.name} /detokenize"
                return text
        if path := settings.PREFIXSCOPE_TOKENIZER_FILE:
            self.used = f"local {Path(path).name}"
            return local_tokenizer(path, settings.PREFIXSCOPE_TOKENIZER_PATTERN).decode(token_ids)
        self.used = BUNDLED_TOKENIZER
        return bundled_text(token_ids)


def bundled_text(token_ids: Sequence[int]) -> str:
    """The text of ``token_ids`` by the bundled GPT-2 tokenizer, ``⟨id⟩`` for each id outside its
    vocabulary (app.domain.gpt2.text_of)."""
    return bundled.text_of(token_ids)
