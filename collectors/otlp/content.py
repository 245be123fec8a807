"""A GenAI span's content attributes as the parts of the chat request it describes. Pure.

OpenTelemetry's GenAI conventions record a request's content when the application opts in to
content capture (opentelemetry.io/docs/specs/semconv/gen-ai/, the JSON schemas
gen-ai-system-instructions.json, gen-ai-input-messages.json and gen-ai-tool-definitions.json):
- `gen_ai.system_instructions`: the system instructions given apart from the chat history, a list
  of parts (`{"type": "text", "content": ...}`);
- `gen_ai.input.messages`: the chat history, messages `{"role", "parts", "name"?}` whose parts are
  `text` (`content`), `tool_call` (`id`, `name`, `arguments`) and `tool_call_response` (`id`,
  `response`), or another type of the instrumentation's;
- `gen_ai.tool.definitions`: the tools, `{"type": "function", "name", "description", "parameters"}`.
Each is a JSON string or a structured value (an array of kvlists). The spans carry no content
attribute for the other parts a chat template renders (tool choice, response format, reasoning
effort); the model is the record's own.

They are read back as the chat-completions body that sent them and digested with the deployment's
key by collectors/parts.py, then dropped: the text is never kept. A span and the gateway give equal
digests for a request where the chat body is the one written here: one text part is a `content`
string (several, a list of `{"type": "text", "text"}`); a tool call's `arguments` not recorded as a
string is written as compact JSON (a client sends the model's own string, spaced as it was); an
assistant message of tool calls alone has no `content` (a client may send `null`); a tool is
`{"type": "function", "function": {"name", "description", "parameters"}}`, keys in that order (an
instrumentation that leaves the description or parameters out, as the conventions allow by default,
gives another tool digest). A span without `gen_ai.input.messages` has no parts: a request whose
messages are unknown cannot say which part changed.
"""

from collections.abc import Mapping
from typing import Any

import msgspec

from collectors.parts import PartDigests, PartsError, part_digests

SYSTEM = "gen_ai.system_instructions"
MESSAGES = "gen_ai.input.messages"
TOOLS = "gen_ai.tool.definitions"
CONTENT_ATTRIBUTES = (SYSTEM, MESSAGES, TOOLS)


def span_parts(attributes: Mapping[str, Any], *, key: bytes) -> PartDigests | None:
    """The parts of the request a span's content attributes describe; None without its input
    messages. Raises PartsError naming the attribute that is not of the conventions' shape."""
    body = span_body(attributes)
    return part_digests(body, key=key) if body is not None else None


def span_body(attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    """The chat-completions body a span's content attributes describe (its system message, its
    messages, its tools); None without its input messages. Raises PartsError as `span_parts`."""
    if MESSAGES not in attributes:
        return None
    system = _objects(attributes, SYSTEM)
    messages = [message for item in _objects(attributes, MESSAGES) for message in _chat_messages(item)]
    if system:
        messages.insert(0, {"role": "system", "content": _content(system, SYSTEM)})
    body: dict[str, Any] = {"messages": messages}
    if TOOLS in attributes:
        body["tools"] = [_tool(tool) for tool in _objects(attributes, TOOLS)]
    return body


def _objects(attributes: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    """The attribute's list of objects (decoded when it is a JSON string); [] when absent."""
    value = attributes.get(name)
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            raise PartsError(f"{name}: not JSON") from None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise PartsError(f"{name}: expected a list of objects")
    return value


def _chat_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One conventions message as the chat messages that sent it: a message of tool call responses
    is one `tool` message per response; tool calls are the message's `tool_calls`."""
    role, parts = message.get("role"), message.get("parts")
    if (
        not isinstance(role, str)
        or not isinstance(parts, list)
        or not all(isinstance(p, dict) for p in parts)
    ):
        raise PartsError(f"{MESSAGES}: expected messages with a role and a list of parts")
    responses = [p for p in parts if p.get("type") == "tool_call_response"]
    if responses and len(responses) == len(parts):
        return [{"role": "tool", "tool_call_id": p.get("id"), "content": _text(p.get("response"))}
                for p in responses]  # fmt: skip
    found: dict[str, Any] = {"role": role}
    if "name" in message:
        found["name"] = message["name"]
    if content := [p for p in parts if p.get("type") != "tool_call"]:
        found["content"] = _content(content, MESSAGES)
    if calls := [p for p in parts if p.get("type") == "tool_call"]:
        found["tool_calls"] = [
            {"id": p.get("id"), "type": "function",
             "function": {"name": p.get("name"), "arguments": _text(p.get("arguments"))}}
            for p in calls
        ]  # fmt: skip
    return [found]


def _content(parts: list[dict[str, Any]], name: str) -> str | list[Any]:
    """Text parts as a chat message's content: one alone as a string; a part of another type as
    the conventions recorded it."""
    texts = [p.get("content") for p in parts if p.get("type") == "text"]
    if len(parts) == 1 and len(texts) == 1:
        if not isinstance(texts[0], str):
            raise PartsError(f"{name}: a text part's content is not a string")
        return texts[0]
    return [{"type": "text", "text": p.get("content")} if p.get("type") == "text" else p for p in parts]


def _text(value: Any) -> str:
    """A tool call's arguments or a tool's response as the chat body's string."""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A conventions function tool as a chat body's; a tool already in that shape, or of another
    type, as it is."""
    if tool.get("type") != "function" or "function" in tool:
        return tool
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    rest = {k: v for k, v in tool.items() if k not in ("type", "name", "description", "parameters")}
    return {"type": "function", "function": function | rest}
