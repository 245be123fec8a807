"""What the gateway adds to a completion request before vLLM sees it. Pure.

vLLM tells a client its prompt token ids only when asked (`return_token_ids: true`), and a stream
its usage only when asked (`stream_options.include_usage: true`). The gateway asks for both when
the client did not, and remembers that it did, so that `answer` can take them out again.

It adds nothing when adding would change more than the fields it strips (vLLM 0.32 source,
`vllm/entrypoints/openai/*/serving.py`):
- `echo`: with `return_token_ids`, vLLM echoes an empty prompt text instead of the prompt;
- `stream_options.continuous_usage_stats`: with `include_usage`, every chunk would carry usage;
- a field of the wrong type: vLLM must answer the client's own request with its own error.
"""

from dataclasses import dataclass
from typing import Any

import msgspec

from collectors.parts import PartDigests, part_digests

RECORDED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


@dataclass(frozen=True, slots=True)
class Plan:
    """The request as it goes upstream, and what of it the client did not ask for."""

    body: bytes
    chat: bool
    added_token_ids: bool
    added_usage: bool
    model: str = ""
    cache_salt: str | None = None
    samples: int = 1  # n, the choices asked for each prompt
    parts: PartDigests | None = None  # a chat request's parts, digested with the gateway's key

    @property
    def edits_answer(self) -> bool:
        return self.added_token_ids or self.added_usage


def plan_request(path: str, body: bytes, *, digest_key: bytes = b"") -> Plan | None:
    """The upstream body of a completion request; None when `body` is not a JSON object. A chat
    request's parts are digested with `digest_key` (collectors/parts.py), before anything is added.

    The body is re-encoded only when something is added; otherwise it goes upstream byte for byte.
    """
    try:
        payload = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    chat = path == "/v1/chat/completions"
    parts = part_digests(payload, key=digest_key) if chat else None
    add_ids = _unset(payload.get("return_token_ids")) and _unset(payload.get("echo"))
    add_usage = payload.get("stream") is True and _may_add_usage(payload.get("stream_options"))
    if add_ids:
        payload["return_token_ids"] = True
    if add_usage:
        payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
    model, salt, samples = payload.get("model"), payload.get("cache_salt"), payload.get("n")
    return Plan(
        body=msgspec.json.encode(payload) if add_ids or add_usage else body,
        chat=chat,
        added_token_ids=add_ids,
        added_usage=add_usage,
        model=model if isinstance(model, str) else "",
        cache_salt=salt if isinstance(salt, str) and salt else None,
        samples=samples if type(samples) is int and samples > 0 else 1,
        parts=parts,
    )


def _may_add_usage(options: Any) -> bool:
    if options is None:
        return True
    if not isinstance(options, dict):
        return False
    return _unset(options.get("include_usage")) and _unset(options.get("continuous_usage_stats"))


def _unset(value: Any) -> bool:
    # Identity, not equality: 0 or "" are for vLLM to judge, not for the gateway to overwrite.
    return value is None or value is False


def trace_id_from(traceparent: str) -> str:
    """The trace id of a W3C `traceparent` header (32 lowercase hex digits); "" when it is not one."""
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32:
        return ""
    trace_id = parts[1].lower()
    if trace_id == "0" * 32 or any(c not in "0123456789abcdef" for c in trace_id):
        return ""
    return trace_id
