"""Where each part of a chat request starts in its rendered prompt, as token positions. Pure.

The gateway does not render chat templates: the server does, and its /tokenize renders a chat body
as its /v1/chat/completions does (vLLM 0.32 `TokenizeChatRequest`, entrypoints/serve/tokenize/
protocol.py: messages, tools, chat_template_kwargs, add_generation_prompt and a few more). So the
gateway has it tokenize the request with one part taken away, or with its messages cut before the
history or before the latest turn: the longest prefix such a rendering shares with the prompt's
token ids is where that part starts to matter. Parts the request does not have are not asked about,
nor are the tool choice and the response format, which /tokenize does not take; nor a cut that
leaves no message (vLLM refuses an empty conversation).

A top-level `reasoning_effort` reaches the template as vLLM's chat completion passes it
(`ChatCompletionRequest.build_chat_params`): as the argument `reasoning_effort`, over the client's,
with `enable_thinking` = effort != "none" when the client did not set it.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from collectors.parts import latest_turn

FULL = ""  # the whole request's rendering: it must be the prompt the server answered for
# The fields of a chat-completions body that /tokenize takes as the chat completion does.
_TOKENIZE_FIELDS = (
    "model", "messages", "tools", "chat_template", "add_generation_prompt", "continue_final_message",
    "add_special_tokens", "mm_processor_kwargs", "media_io_kwargs",
)  # fmt: skip
_SYSTEM_ROLES = frozenset({"system", "developer"})
_EFFORT = "reasoning_effort"


def renderings(payload: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The /tokenize bodies to ask for: FULL, and per part (RequestPart's value: system, tools,
    reasoning_effort, template_kwargs, history, messages) the request without it: seven at most."""
    body = {name: payload[name] for name in _TOKENIZE_FIELDS if name in payload}
    kwargs, effort_kwargs = _template_kwargs(payload)
    full = {**body, "chat_template_kwargs": kwargs} if kwargs else body
    found = {FULL: full}
    messages = [m for m in payload.get("messages") or () if isinstance(m, dict)]
    if payload.get("tools"):
        found["tools"] = {key: value for key, value in full.items() if key != "tools"}
    if effort_kwargs:
        found[_EFFORT] = _with_kwargs(full, {k: v for k, v in kwargs.items() if k not in effort_kwargs})
    if set(kwargs) - effort_kwargs:
        found["template_kwargs"] = _with_kwargs(full, {k: v for k, v in kwargs.items() if k in effort_kwargs})
    if any(m.get("role") in _SYSTEM_ROLES for m in messages):
        found["system"] = {**full, "messages": [m for m in messages if m.get("role") not in _SYSTEM_ROLES]}
    for part, cut in _cuts(messages).items():
        found[part] = {**full, "messages": messages[:cut], "add_generation_prompt": False,
                       "continue_final_message": False}  # fmt: skip
    return found


def part_starts(prompt: Sequence[int], rendered: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Each part's start: the tokens its rendering without it shares with `prompt`."""
    return {part: _common(prompt, ids) for part, ids in rendered.items() if part != FULL}


def _template_kwargs(payload: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The template arguments the chat completion renders with, and those the reasoning effort sets."""
    kwargs = payload.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    effort = payload.get(_EFFORT)
    if effort is None:
        return kwargs, {_EFFORT} & set(kwargs)
    added = {_EFFORT}
    if "enable_thinking" not in kwargs:
        kwargs["enable_thinking"] = effort != "none"
        added.add("enable_thinking")
    return {**kwargs, _EFFORT: effort}, added


def _with_kwargs(body: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    rest = {key: value for key, value in body.items() if key != "chat_template_kwargs"}
    return {**rest, "chat_template_kwargs": kwargs} if kwargs else rest


def _cuts(messages: list[dict[str, Any]]) -> dict[str, int]:
    """Where the history and the latest turn start among `messages` (indexes), when both a history or
    turn and something before it are there."""
    others = [i for i, m in enumerate(messages) if m.get("role") not in _SYSTEM_ROLES]
    latest = latest_turn([messages[i] for i in others])
    cuts = {}
    if len(others) > latest and others[0] > 0:
        cuts["history"] = others[0]
    if latest and (at := others[len(others) - latest]) > 0:
        cuts["messages"] = at
    return cuts


def _common(ours: Sequence[int], theirs: Sequence[int]) -> int:
    shared = 0
    for a, b in zip(ours, theirs, strict=False):
        if a != b:
            break
        shared += 1
    return shared
