"""One request's token usage, read from whichever shape reported it. Pure.

- OpenAI / vLLM: `prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`
  (details may be null: vLLM without --enable-prompt-tokens-details, or older versions on a miss).
- Anthropic (and Bedrock's InvokeModel, whose body is Anthropic's): `input_tokens` (uncached only),
  `cache_read_input_tokens`, `cache_creation_input_tokens` (written), `output_tokens`; the prompt is
  the sum of the three input counts. `cache_creation` splits the writes by TTL:
  `ephemeral_5m_input_tokens`, `ephemeral_1h_input_tokens` (platform.claude.com prompt caching; the
  SDKs' CacheCreation type).
- Bedrock Converse (`TokenUsage`): `inputTokens` (uncached only: reads and writes are counted apart),
  `cacheReadInputTokens`, `cacheWriteInputTokens`, `outputTokens`, `cacheDetails`: the writes by
  TTL, `[{"ttl": "5m" | "1h", "inputTokens"}]`, empty when nothing was written (Bedrock API
  reference, TokenUsage and CacheDetail).
- Gemini `usageMetadata` (bare, or under that key): `promptTokenCount` (cached tokens included),
  `cachedContentTokenCount`, `candidatesTokenCount`; no writes are reported. The Interactions API's
  `usage`: `total_input_tokens`, `total_cached_tokens`, `total_output_tokens`.
- OpenTelemetry GenAI span attributes: `gen_ai.usage.input_tokens` (or vLLM's
  `gen_ai.usage.prompt_tokens`), `gen_ai.usage.cache_read.input_tokens`,
  `gen_ai.usage.cache_creation.input_tokens`, `gen_ai.usage.output_tokens`.

Cache writes are kept where a shape reports them (None where it does not): zero writes and zero reads
on a long repeated prefix is how a cache marker stripped on the way shows (app/domain/hosted.py).
So is the TTL they were written with, the longest of a request's writes (`cache_ttl_seconds`: a
request that wrote a 1-hour and a 5-minute entry and read neither later found even the hour's gone);
None when it wrote nothing or the shape does not say (the provider's default then applies).
"""

import re
from collections.abc import Mapping
from typing import Any

import msgspec

# No request has two billion tokens; a count beyond this is garbage (and beyond the 32-bit columns).
_MAX_COUNT = 2**31 - 1

# The provider a shape alone names: only hosted APIs answer in these (vLLM answers OpenAI's and,
# on /v1/messages, Anthropic's shape, so those two name none).
BEDROCK = "bedrock"
GEMINI = "gemini"


class UsageError(ValueError):
    """A usage field holds something that is not a token count; the message names it."""


class Usage(msgspec.Struct, frozen=True):
    """Token counts of one request; None where the source did not say. `provider`: the hosted API
    the shape itself names ("" when the shape is also vLLM's)."""

    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    cache_write_tokens: int | None = None
    provider: str = ""
    cache_ttl_seconds: int | None = None  # the longest TTL the writes used; None: none said


def usage_from(payload: Mapping[str, Any]) -> Usage:
    """Read an OpenAI, Anthropic, Bedrock or Gemini usage object; an empty mapping gives all None."""
    if "input_tokens" in payload or "cache_read_input_tokens" in payload:
        return _anthropic(payload)
    if "inputTokens" in payload or "cacheReadInputTokens" in payload:
        return _bedrock(payload)
    if "usageMetadata" in payload:
        inner = payload["usageMetadata"]
        if not isinstance(inner, Mapping):
            raise UsageError("usage.usageMetadata: expected an object")
        return _gemini(inner, "usage.usageMetadata.")
    if "promptTokenCount" in payload or "cachedContentTokenCount" in payload:
        return _gemini(payload, "usage.")
    if "total_input_tokens" in payload or "total_cached_tokens" in payload:
        return _interactions(payload)
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
    return Usage(
        prompt,
        _count(attributes, "gen_ai.usage.cache_read.input_tokens", ""),
        completion,
        cache_write_tokens=_count(attributes, "gen_ai.usage.cache_creation.input_tokens", ""),
    )


def _anthropic(payload: Mapping[str, Any]) -> Usage:
    return _split(payload, ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"),
                  "output_tokens", provider="", ttl=_anthropic_ttl(payload))  # fmt: skip


def _bedrock(payload: Mapping[str, Any]) -> Usage:
    return _split(payload, ("inputTokens", "cacheReadInputTokens", "cacheWriteInputTokens"),
                  "outputTokens", provider=BEDROCK, ttl=_bedrock_ttl(payload))  # fmt: skip


def _split(
    payload: Mapping[str, Any], inputs: tuple[str, str, str], output: str, *, provider: str, ttl: int | None
) -> Usage:
    """A shape that counts uncached, read and written input apart: the prompt is their sum."""
    uncached, read, written = (_count(payload, key, "usage.") for key in inputs)
    parts = [n for n in (uncached, read, written) if n is not None]
    return Usage(
        prompt_tokens=sum(parts) if parts else None,
        cached_tokens=read,
        completion_tokens=_count(payload, output, "usage."),
        cache_write_tokens=written,
        provider=provider,
        cache_ttl_seconds=ttl,
    )


_ANTHROPIC_TTLS = (("ephemeral_1h_input_tokens", 3600), ("ephemeral_5m_input_tokens", 300))  # longest first


def _anthropic_ttl(payload: Mapping[str, Any]) -> int | None:
    """The longest TTL of `cache_creation`'s writes; None without it or without a write."""
    split = payload.get("cache_creation")
    if split is None:
        return None
    if not isinstance(split, Mapping):
        raise UsageError("usage.cache_creation: expected an object or null")
    for key, seconds in _ANTHROPIC_TTLS:
        if _count(split, key, "usage.cache_creation."):
            return seconds
    return None


def _bedrock_ttl(payload: Mapping[str, Any]) -> int | None:
    """The longest TTL of `cacheDetails`' writes; None without them or without a write."""
    details = payload.get("cacheDetails")
    if details is None:
        return None
    if not isinstance(details, list) or not all(isinstance(d, Mapping) for d in details):
        raise UsageError("usage.cacheDetails: expected a list of objects")
    found = [
        ttl_seconds(detail.get("ttl"), f"usage.cacheDetails[{i}].ttl")
        for i, detail in enumerate(details)
        if _count(detail, "inputTokens", f"usage.cacheDetails[{i}].")
    ]
    return max(found, default=None)


_DURATION = re.compile(r"([1-9][0-9]{0,4})([smh])")  # at most 99999 h: within a 32-bit column
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def ttl_seconds(value: Any, name: str) -> int:
    """A cache TTL as the providers write it ("5m", "1h": Anthropic's cache_control.ttl, Bedrock's
    CacheDetail.ttl), in seconds; raises UsageError naming `name` for anything else."""
    found = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise UsageError(f"{name}: expected a duration such as 5m or 1h")
    return int(found.group(1)) * _UNIT_SECONDS[found.group(2)]


def _gemini(payload: Mapping[str, Any], prefix: str) -> Usage:
    """promptTokenCount includes the cached tokens; a response without cachedContentTokenCount
    read none (Gemini leaves the field out at zero), so it is 0 once a prompt count is given."""
    prompt = _count(payload, "promptTokenCount", prefix)
    cached = _count(payload, "cachedContentTokenCount", prefix)
    if cached is None and prompt is not None:
        cached = 0
    return Usage(prompt, cached, _count(payload, "candidatesTokenCount", prefix), provider=GEMINI)


def _interactions(payload: Mapping[str, Any]) -> Usage:
    prompt = _count(payload, "total_input_tokens", "usage.")
    cached = _count(payload, "total_cached_tokens", "usage.")
    if cached is None and prompt is not None:
        cached = 0
    return Usage(prompt, cached, _count(payload, "total_output_tokens", "usage."), provider=GEMINI)


def _count(payload: Mapping[str, Any], key: str, prefix: str) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        raise UsageError(f"{prefix}{key}: expected a token count (a non-negative integer)")
    return value


# Response headers by which a gateway says it answered from its semantic cache (the model never
# saw the request: no prefix was reused or missed). Portkey documents `x-portkey-cache-status` with
# "SEMANTIC HIT" (and "HIT" for its exact-match cache, which is no prefix reuse either).
_CACHE_STATUS_HEADERS = {"x-portkey-cache-status": ("SEMANTIC HIT", "HIT")}


def gateway_cache_hit(headers: Mapping[str, Any]) -> bool | None:
    """Whether a gateway answered the request from its response cache (semantic or exact), by its
    documented headers (names in any case); None when no such header was sent."""
    found = None
    for name, value in headers.items():
        hits = _CACHE_STATUS_HEADERS.get(str(name).lower())
        if hits is not None and isinstance(value, str):
            found = found or value.strip().upper() in hits
    return found
