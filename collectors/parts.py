"""Digests of a chat-completions request's parts: what changed between two requests, never what
they said. Pure.

The gateway sees the request body; it keeps, per request, a keyed digest of each part the chat
template renders (system messages, tools, tool choice, response format, reasoning effort, the other
chat-template arguments key by key, and each message), so that a diagnosis can tell which part of a
prompt changed from the request it departs from. A digest is BLAKE2b keyed with the deployment's
secret (8 bytes, hex): without the key a digest cannot be matched against a dictionary of likely
texts, and 64 bits make an accidental equality of two different parts negligible at any traffic.

Tools are kept one digest per tool in the order sent (each tool's JSON with its keys sorted), plus
one digest of the list exactly as sent (its keys in the client's order): a set that differs means a
tool was added, removed or edited; the same set in another order, reordered; the same ordered tools
with other bytes, re-serialized (a schema's keys in another order, which the template renders as is).

Other sources give the same parts: an application's request body (`body_digests`: an OpenAI
chat-completions body, or an Anthropic Messages body read as the chat body that says the same) and
an OpenTelemetry GenAI span's content attributes (collectors/otlp/content.py). Only the parts a chat
template renders are digested: sampling parameters (temperature, max_tokens) change no prompt token.

A hosted API's record that sent its body and no `prompt_blocks` gets them from it (`content_blocks`):
the body's content blocks in the order the provider caches the prompt, each a keyed digest, and
which of them carried a cache marker.

`starts` says where each part starts in the rendered prompt, as a token position, when the gateway
learned it after the answer (collectors/partstarts.py): positions, never text.
"""

import hashlib
from typing import Any, NamedTuple

import msgspec

DIGEST_BYTES = 8
MAX_TEMPLATE_KWARGS = 32  # chat-template arguments kept, by sorted name; the rest in one digest
MAX_KWARG_NAME = 64
MAX_MESSAGES = 4096  # messages kept; a longer conversation's later ones are in one digest
_SYSTEM_ROLES = frozenset({"system", "developer"})
_REST = "…"  # the name the overflowing chat-template arguments are kept under


class PartsError(ValueError):
    """A request body or content attribute that is not a chat request's shape. The message names the
    field and what was expected, never a value (which is prompt text)."""


def digest_key(secret: str) -> bytes:
    """The key of every source's digests, derived from the deployment's secret: digests compare
    across the gateway's processes, the ingest and restarts, and only within one deployment."""
    return hashlib.sha256(b"prefixscope request parts\0" + secret.encode()).digest()


class PartDigests(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A request's parts as keyed digests ("" for a part it did not have).

    `messages` are the non-system messages in order; the last `latest` of them are the request's
    own turn (those after the last assistant message), the others its history.
    """

    system: str = ""
    tools: list[str] = []  # one per tool, in the order sent, each over its keys sorted
    tools_sent: str = ""  # the tools list as sent
    tool_choice: str = ""
    response_format: str = ""
    reasoning_effort: str = ""  # top-level, else chat_template_kwargs["reasoning_effort"]
    template_kwargs: dict[str, str] = {}  # the other chat-template arguments, by name
    messages: list[str] = []
    latest: int = 0
    starts: dict[str, int] = {}  # part (system, tools, history, messages: the latest...) -> token


def part_digests(payload: dict[str, Any], *, key: bytes) -> PartDigests:
    """The digests of a chat-completions body's parts (a body of another shape: what it has).

    Values of an unexpected type are digested as they are (vLLM refuses them, and a refused request
    is never recorded)."""
    digest = _Digest(key)
    messages = payload.get("messages")
    messages = messages if isinstance(messages, list) else []
    system = [m for m in messages if isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES]
    others = [m for m in messages if not (isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES)]
    tools = payload.get("tools")
    kwargs = payload.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    effort = payload.get("reasoning_effort", kwargs.pop("reasoning_effort", None))
    return PartDigests(
        system=digest.of(system) if system else "",
        tools=[digest.of(tool) for tool in tools] if isinstance(tools, list) else [],
        tools_sent=digest.sent(tools) if tools else "",
        tool_choice=digest.optional(payload.get("tool_choice")),
        response_format=digest.optional(payload.get("response_format")),
        reasoning_effort=digest.optional(effort),
        template_kwargs=_kwargs(kwargs, digest),
        messages=_messages(others, digest),
        latest=latest_turn(others),
    )


class _Digest:
    def __init__(self, key: bytes) -> None:
        self.key = hashlib.blake2b(key, digest_size=32).digest()  # any length of secret, fit for BLAKE2b

    def sent(self, value: Any) -> str:
        """Over the value's JSON as the client ordered its keys."""
        return hashlib.blake2b(msgspec.json.encode(value), key=self.key, digest_size=DIGEST_BYTES).hexdigest()

    def of(self, value: Any) -> str:
        """Over the value's JSON with its keys sorted: equal for equal values however serialized."""
        encoded = msgspec.json.encode(value, order="sorted")
        return hashlib.blake2b(encoded, key=self.key, digest_size=DIGEST_BYTES).hexdigest()

    def optional(self, value: Any) -> str:
        return "" if value is None else self.of(value)


def _kwargs(kwargs: dict[str, Any], digest: _Digest) -> dict[str, str]:
    """Per argument name (bounded in number and length: a name is not prompt text, but it is the
    client's); past MAX_TEMPLATE_KWARGS, the rest in one digest."""
    names = sorted(str(name) for name in kwargs)
    kept = {name[:MAX_KWARG_NAME]: digest.of(kwargs[name]) for name in names[:MAX_TEMPLATE_KWARGS]}
    if rest := names[MAX_TEMPLATE_KWARGS:]:
        kept[_REST] = digest.of({name: kwargs[name] for name in rest})
    return kept


def _messages(messages: list[Any], digest: _Digest) -> list[str]:
    kept = [digest.of(message) for message in messages[: MAX_MESSAGES - 1]]
    if len(messages) >= MAX_MESSAGES:
        kept.append(digest.of(messages[MAX_MESSAGES - 1 :]))
    return kept


def latest_turn(messages: list[Any]) -> int:
    """How many trailing messages are the request's own turn: those after the last assistant one
    (all of them in a conversation without one)."""
    for back, message in enumerate(reversed(messages)):
        if isinstance(message, dict) and message.get("role") == "assistant":
            return min(back, MAX_MESSAGES)
    return min(len(messages), MAX_MESSAGES)


def body_digests(body: Any, *, key: bytes) -> PartDigests:
    """The digests of a request body an application reports (not the gateway, which vLLM checks):
    an OpenAI chat-completions body or an Anthropic Messages body. Anthropic's top-level `system` is
    its system message, its tools (`name`, `description`, `input_schema`) are function tools with
    those `parameters`, `thinking` is its reasoning effort; a block's `cache_control` is left out
    (a marker is not content: where markers sit is the record's `cache_breakpoints`). Raises
    PartsError for a body of neither shape."""
    _check_body(body)
    chat = dict(body)
    system = chat.pop("system", None)
    messages = [_unmarked(message) for message in body["messages"]]
    if system is not None:
        content = system if isinstance(system, str) else [_unmarked_block(b) for b in system]
        messages.insert(0, {"role": "system", "content": content})
    chat["messages"] = messages
    if isinstance(body.get("tools"), list):
        chat["tools"] = [_function_tool(tool) for tool in body["tools"]]
    if "thinking" in chat and "reasoning_effort" not in chat:
        chat["reasoning_effort"] = chat.pop("thinking")
    return part_digests(chat, key=key)


class ContentBlocks(NamedTuple):
    """A prompt's content blocks as a hosted record's `prompt_blocks` and `cache_breakpoints` say them."""

    digests: list[str]
    marked: list[int]  # indexes of the blocks with a cache marker (Anthropic's cache_control)


def content_blocks(body: dict[str, Any], *, key: bytes, limit: int) -> ContentBlocks:
    """A chat request body's content blocks, at most `limit`, in the order a provider caches the
    prompt: tools, system, messages (Anthropic's documented order; OpenAI's cached prefix holds the
    same, tools first). One block per tool, per system or message content block (a string is the
    text block it stands for), per message without content (its tool calls); each digest is over
    the block with its role, its marker left out (moving a marker changes no content). The body is
    one `body_digests` accepted."""
    digest = _Digest(key)
    blocks: list[tuple[str, Any]] = [("tool", tool) for tool in body.get("tools") or []]
    if (system := body.get("system")) is not None:
        blocks += [("system", block) for block in _text_blocks(system)]
    for message in body["messages"]:
        role, content = str(message.get("role")), message.get("content")
        blocks += (
            [(role, block) for block in _text_blocks(content)] if content is not None else [(role, message)]
        )
    blocks = blocks[:limit]
    marked = [
        i for i, (_, block) in enumerate(blocks) if isinstance(block, dict) and "cache_control" in block
    ]
    digests = [digest.of({"role": role, "block": _unmarked_block(block)}) for role, block in blocks]
    return ContentBlocks(digests, marked)


def _text_blocks(content: Any) -> list[Any]:
    """A content's blocks: a string is one text block (Anthropic's shorthand for it); a value of
    another shape is one block as it is."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else [content]


def _check_body(body: Any) -> None:
    if not isinstance(body, dict):
        raise PartsError("request_body: expected an object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise PartsError("request_body.messages: expected a list of objects with a role")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise PartsError("request_body.tools: expected a list of objects")
    system = body.get("system")
    blocks = isinstance(system, list) and all(isinstance(b, dict) for b in system)
    if not (system is None or isinstance(system, str) or blocks):
        raise PartsError("request_body.system: expected a string or a list of content blocks")
    if not isinstance(body.get("chat_template_kwargs", {}), dict):
        raise PartsError("request_body.chat_template_kwargs: expected an object")


def _unmarked_block(block: Any) -> Any:
    return {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, dict) else block


def _unmarked(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return message | {"content": [_unmarked_block(block) for block in content]}


_ANTHROPIC_TOOL_KEYS = frozenset({"name", "description", "input_schema", "cache_control", "type"})


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic tool as the function tool a chat body sends (its keys in the order OpenAI's
    clients write them); any other tool as it is."""
    if "input_schema" not in tool:
        return tool
    function: dict[str, Any] = {k: tool[k] for k in ("name", "description") if k in tool}
    function["parameters"] = tool["input_schema"]
    rest = {k: v for k, v in tool.items() if k not in _ANTHROPIC_TOOL_KEYS}
    return {"type": "function", "function": function | rest}
