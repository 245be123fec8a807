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

`starts` says where each part starts in the rendered prompt, as a token position, when the gateway
learned it after the answer (collectors/partstarts.py): positions, never text.
"""

import hashlib
from typing import Any

import msgspec

DIGEST_BYTES = 8
MAX_TEMPLATE_KWARGS = 32  # chat-template arguments kept, by sorted name; the rest in one digest
MAX_KWARG_NAME = 64
MAX_MESSAGES = 4096  # messages kept; a longer conversation's later ones are in one digest
_SYSTEM_ROLES = frozenset({"system", "developer"})
_REST = "…"  # the name the overflowing chat-template arguments are kept under


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
