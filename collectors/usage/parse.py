"""One request's token usage, read from whichever shape reported it. Pure.

- OpenAI / vLLM: `prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`
  (details may be null: vLLM without --enable-prompt-tokens-details, or older versions on a miss).
- Anthropic: `input_tokens` (uncached only), `cache_read_input_tokens`, `cache_creation_input_tokens`,
  `output_tokens`; the prompt is the sum of the three input counts.
- OpenTelemetry GenAI span attributes: `gen_ai.usage.input_tokens` (or vLLM's
  `gen_ai.usage.prompt_tokens`), `gen_ai.usage.cache_read.input_tokens`, `gen_ai.usage.output_tokens`.
"""

from collections.abc import Mapping
from typing import Any

import msgspec

# No request has two billion tokens; a count beyond this is garbage (and beyond the 32-bit columns).
_MAX_COUNT = 2**31 - 1


class UsageError(ValueError):
    """A usage field holds something that is not a token count; the message names it."""


class Usage(msgspec.Struct, frozen=True):
    """Token counts of one request; None where the source did not say."""

    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None


def usage_from(payload: Mapping[str, Any]) -> Usage:
    """Read an OpenAI or Anthropic usage object; an empty mapping gives all None."""
    if "input_tokens" in payload or "cache_read_input_tokens" in payload:
        return _anthropic(payload)
    details = payload.get("prompt_tokens_details")
    if details is not None and not isinstance(details, Mapping):
        raise UsageError("usage.prompt_tokens_details: expected an object or null")
    return Usage(
        prompt_tokens=_count(payload, "prompt_tokens", "usage."),
        cached_tokens=_count(details or {}, "cached_tokens", "usage.prompt_tokens_details."),
        completion_tokens=_count(payload, "completion_tokens", "usage."),
    )


def usage_from_span(attributes: Mapping[str, Any]) -> Usage:
    """Read GenAI semantic-convention attributes of a span (vLLM's names included)."""
    prompt = _count(attributes, "gen_ai.usage.input_tokens", "")
    if prompt is None:
        prompt = _count(attributes, "gen_ai.usage.prompt_tokens", "")
    completion = _count(attributes, "gen_ai.usage.output_tokens", "")
    if completion is None:
        completion = _count(attributes, "gen_ai.usage.completion_tokens", "")
    return Usage(prompt, _count(attributes, "gen_ai.usage.cache_read.input_tokens", ""), completion)


def _anthropic(payload: Mapping[str, Any]) -> Usage:
    uncached = _count(payload, "input_tokens", "usage.")
    read = _count(payload, "cache_read_input_tokens", "usage.")
    created = _count(payload, "cache_creation_input_tokens", "usage.")
    parts = [n for n in (uncached, read, created) if n is not None]
    return Usage(
        prompt_tokens=sum(parts) if parts else None,
        cached_tokens=read,
        completion_tokens=_count(payload, "output_tokens", "usage."),
    )


def _count(payload: Mapping[str, Any], key: str, prefix: str) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        raise UsageError(f"{prefix}{key}: expected a token count (a non-negative integer)")
    return value
