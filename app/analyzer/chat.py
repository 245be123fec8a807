"""Chat and completion logs into `Line`s: kvlint 0.1.1's inputs and OpenAI-style request logs.

Token ids are taken where the log has them (vLLM's `prompt_token_ids` in a response asked with
`return_token_ids`, or a completion prompt given as ids); otherwise the text is tokenized with the
bundled GPT-2 tokenizer (app/domain/gpt2.py), chat messages rendered first with its ChatML template
and a request's `tools` as a system message of their JSON, which the report says: the model's own
tokenizer and template may give other ids, and so other block boundaries.

An OpenAI-style log line: `{"request": body, "response": body}`, and optionally `request_id`,
`arrived_at` or `timestamp`, `server`, `tenant`, `template`, `request_headers`. The response's
`usage` gives `prompt_tokens`, `completion_tokens` and `prompt_tokens_details.cached_tokens`
(what the engine reused); `cache_salt` in the body is the request's salt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from app.analyzer.lines import BadLine, Line, Lines, Skip, add_token_ids, arrival, natural, text
from app.domain import gpt2

TOKENIZED_NOTE = (
    "{count} request(s) had no token ids: their text was tokenized with the bundled GPT-2 tokenizer"
    " (chat messages rendered with its ChatML template), which may differ from the model's."
)
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                   "assistant": "assistant", "bot": "assistant", "system": "system", "tool": "tool",
                   "function": "tool", "observation": "tool"}  # fmt: skip
_CONVERSATION_KEYS = ("conversations", "conversation", "items")


def read_kvlint_line(lines: Lines, item: dict[str, Any], number: int) -> Iterator[Line]:
    """kvlint's three inputs: a request body with `messages`, a ShareGPT conversation (a request per
    user turn), or a plain `prompt` text."""
    request_id = text(item.get("request_id"), f"req-{number}")
    session = text(item.get("session_id"))
    arrived = arrival(item)
    if "messages" in item:
        prompt = _rendered(item["messages"], item.get("tools"))
        yield _text_line(lines, prompt, request_id=request_id, session=session, arrived=arrived,
                         group=text(item.get("model")))  # fmt: skip
        return
    turns = next((item[key] for key in _CONVERSATION_KEYS if isinstance(item.get(key), list)), None)
    if turns is not None:
        yield from _sharegpt(lines, turns, text(item.get("id"), f"conv-{number}"))
        return
    plain = item.get("prompt")
    if not isinstance(plain, str):
        raise BadLine(Skip.NO_PROMPT)
    yield _text_line(lines, plain, request_id=request_id, session=session, arrived=arrived)


def _sharegpt(lines: Lines, turns: list[Any], conversation: str) -> Iterator[Line]:
    history: list[dict[str, str]] = []
    made: list[Line] = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise BadLine(Skip.BAD_MESSAGES)
        role = _SHAREGPT_ROLES.get(str(turn.get("from", turn.get("role", ""))).strip().lower())
        content = turn.get("value", turn.get("content")) or ""
        if role is None or not isinstance(content, str):
            raise BadLine(Skip.BAD_MESSAGES)
        history.append({"role": role, "content": content})
        if role == "user":  # a client sends the whole history at each user turn
            prompt = gpt2.render_chat(history)
            made.append(_text_line(lines, prompt, request_id=f"{conversation}-t{len(made) + 1}",
                                   session=conversation, arrived=None))  # fmt: skip
    yield from made


def read_log_line(lines: Lines, item: dict[str, Any], number: int) -> Line:
    """One OpenAI-style request log line (see the module's docstring)."""
    body, response = item["request"], item["response"]
    usage = response.get("usage") or {}
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(usage, dict) or not isinstance(details, dict | None):
        raise BadLine(Skip.BAD_FIELD)
    headers = item.get("request_headers") or {}
    fields = {
        "request_id": text(item.get("request_id", headers.get("x-request-id", response.get("id"))),
                           f"line-{number}"),
        "arrived": arrival(item) if ("arrived_at" in item or "timestamp" in item)
        else natural(response.get("created"), None),
        "server": text(item.get("server")),
        "group": text(body.get("model", response.get("model"))),
        "salt": text(body.get("cache_salt")),
        "tenant": text(item.get("tenant", body.get("user"))),
        "template": text(item.get("template")),
        "cached_tokens": natural((details or {}).get("cached_tokens"), None),
        "output_tokens": natural(usage.get("completion_tokens"), 0) or 0,
    }  # fmt: skip
    token_ids = _response_token_ids(response, body)
    if token_ids is not None:
        span = add_token_ids(lines, token_ids)
        prompt_tokens = natural(usage.get("prompt_tokens"), span[1] - span[0])
        return Line(prompt_tokens=prompt_tokens or 0, tokens=span, **fields)  # type: ignore[arg-type]
    if "messages" in body:
        prompt = _rendered(body["messages"], body.get("tools"))
    elif isinstance(body.get("prompt"), str):
        prompt = body["prompt"]
    else:
        raise BadLine(Skip.NO_PROMPT)
    line = _text_line(lines, prompt, **fields)
    line.prompt_tokens = natural(usage.get("prompt_tokens"), line.prompt_tokens) or line.prompt_tokens
    return line


def _response_token_ids(response: dict[str, Any], body: dict[str, Any]) -> object:
    """The prompt's token ids where the log has them, else None."""
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(first, dict) and (found := first.get("prompt_token_ids")) is not None:
        return found
    if (found := response.get("prompt_token_ids")) is not None:
        return found
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt[:1]):
        return prompt
    return None


def _rendered(messages: object, tools: object) -> str:
    """Chat messages (and tools) as the bundled ChatML template renders them."""
    if not isinstance(messages, list) or not messages:
        raise BadLine(Skip.BAD_MESSAGES)
    rendered: list[dict[str, str]] = []
    if tools is not None:
        # As sent, in their order: an unsorted tool list is a cache killer, which sorting here would hide.
        rendered.append({"role": "system", "content": json.dumps(tools, ensure_ascii=False)})
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadLine(Skip.BAD_MESSAGES)
        content = message.get("content")
        if not isinstance(content, str | None):
            raise BadLine(Skip.BAD_MESSAGES)  # content parts (images) are not text to tokenize
        rendered.append({"role": message["role"], "content": content or ""})
    try:
        return gpt2.render_chat(rendered)
    except ValueError:
        raise BadLine(Skip.BAD_MESSAGES) from None


def _text_line(lines: Lines, prompt: str, **fields: Any) -> Line:
    token_ids = gpt2.encode(prompt)
    if not token_ids:
        raise BadLine(Skip.EMPTY_PROMPT)
    span = lines.add_tokens(token_ids)
    lines.tokenized += 1
    return Line(prompt_tokens=span[1] - span[0], tokens=span, **fields)
