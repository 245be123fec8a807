"""A request's diagnosis in the hosted APIs' cache-diagnostics shapes, so tools written against
OpenAI's or Anthropic's read a self-hosted fleet the same way. Pure; the mapping is here only.

Sources (shared/reference/field-2026-12.md, section 0 item 2 and section 2.1):
- OpenAI (gpt-5.6+ Responses): `prompt_cache_diagnostics` is `{"type": "cache_hit"}`,
  `{"type": "cache_miss", "reason", "cache_missed_tokens", "comparison_reusable_tokens"}`,
  `{"type": "comparison_response_not_found"}` or `{"type": "unavailable"}`; `reason` is one of nine:
  model_changed, prompt_cache_key_changed, tools_changed, text_format_changed,
  reasoning_effort_changed, verbosity_changed, context_compacted, input_changed,
  service_tier_changed (the enum from third-party wire types that agree, [OA-ENUM]:
  docs.rs gproxy-protocol wire/openai/responses/diagnostics.rs; rubydoc openai
  Responses::Response::PromptCacheDiagnostics::CacheMiss).
- Anthropic: `diagnostics.cache_miss_reason`, one of model_changed, system_changed, tools_changed,
  messages_changed, previous_message_not_found, unavailable (null: no structural change), with an
  approximate `cache_missed_input_tokens` (platform.claude.com build-with-claude/cache-diagnostics).

Both compare a request's structure with an earlier one; neither names eviction, routing or a
restart. A miss Prefixscope puts down to one of those (the request's structure unchanged) has no
reason in either enum: OpenAI's shape then says `unavailable`, Anthropic's reason is null; the
native `cause` beside it says what happened. Never-reusable tokens (below one block, the request's
own new content) are not missed tokens; a request that lost none of its reusable tokens is a hit.

| Prefixscope                     | OpenAI `reason`           | Anthropic `cache_miss_reason` |
|---------------------------------|---------------------------|-------------------------------|
| part model, adapter             | model_changed             | model_changed                 |
| part tools                      | tools_changed             | tools_changed                 |
| part tool_choice                | tools_changed             | messages_changed (1)          |
| part system                     | input_changed (2)         | system_changed                |
| part response_format            | text_format_changed       | messages_changed              |
| part reasoning_effort           | reasoning_effort_changed  | messages_changed (1)          |
| part template_kwargs            | input_changed             | messages_changed              |
| part history                    | context_compacted         | messages_changed              |
| part messages, or none known    | input_changed             | messages_changed              |
| cause salt, cache_key_changed   | prompt_cache_key_changed  | null                          |
| any other cause                 | (type unavailable)        | null                          |
(1) Anthropic documents that tool_choice and thinking parameters invalidate the cached messages,
not the tools or system. (2) The Responses API takes instructions as input.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.misses import Cause, RequestPart

OPENAI_REASONS = (
    "model_changed", "prompt_cache_key_changed", "tools_changed", "text_format_changed",
    "reasoning_effort_changed", "verbosity_changed", "context_compacted", "input_changed",
    "service_tier_changed",
)  # fmt: skip
ANTHROPIC_REASONS = (
    "model_changed", "system_changed", "tools_changed", "messages_changed", "previous_message_not_found",
    "unavailable",
)  # fmt: skip

_BY_PART: dict[RequestPart, tuple[str, str]] = {  # part -> (OpenAI reason, Anthropic reason)
    RequestPart.MODEL: ("model_changed", "model_changed"),
    RequestPart.ADAPTER: ("model_changed", "model_changed"),
    RequestPart.TOOLS: ("tools_changed", "tools_changed"),
    RequestPart.TOOL_CHOICE: ("tools_changed", "messages_changed"),
    RequestPart.SYSTEM: ("input_changed", "system_changed"),
    RequestPart.RESPONSE_FORMAT: ("text_format_changed", "messages_changed"),
    RequestPart.REASONING_EFFORT: ("reasoning_effort_changed", "messages_changed"),
    RequestPart.TEMPLATE_KWARGS: ("input_changed", "messages_changed"),
    RequestPart.HISTORY: ("context_compacted", "messages_changed"),
    RequestPart.MESSAGES: ("input_changed", "messages_changed"),
}
_KEY_CAUSES = frozenset({Cause.SALT, Cause.CACHE_KEY_CHANGED})


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the shapes need of a diagnosis; `diagnosed` False: none yet, or none possible."""

    diagnosed: bool
    cause: Cause | None = None
    changed_part: RequestPart | None = None
    missed_tokens: int = 0  # reusable tokens lost (never-reusable ones left out)
    comparison_reusable_tokens: int = 0  # leading tokens the comparison request had as this one
    compared_with: str = ""  # its request id


@dataclass(frozen=True, slots=True)
class OpenAIDiagnostics:
    type: str  # cache_hit | cache_miss | comparison_response_not_found | unavailable
    reason: str | None = None
    cache_missed_tokens: int | None = None
    comparison_reusable_tokens: int | None = None
    comparison_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class AnthropicDiagnostics:
    cache_miss_reason: str | None
    cache_missed_input_tokens: int | None


def openai_shape(outcome: Outcome) -> OpenAIDiagnostics:
    """OpenAI's `prompt_cache_diagnostics` of a request (see the module's table)."""
    if not outcome.diagnosed:
        return OpenAIDiagnostics("unavailable")
    if outcome.missed_tokens == 0:
        return OpenAIDiagnostics("cache_hit")
    reason = _reasons(outcome)[0]
    if reason is None:
        return OpenAIDiagnostics("unavailable")
    return OpenAIDiagnostics(
        "cache_miss",
        reason=reason,
        cache_missed_tokens=outcome.missed_tokens,
        comparison_reusable_tokens=outcome.comparison_reusable_tokens,
        comparison_request_id=outcome.compared_with or None,
    )


def anthropic_shape(outcome: Outcome) -> AnthropicDiagnostics:
    """Anthropic's `diagnostics` of a request (see the module's table)."""
    if not outcome.diagnosed:
        return AnthropicDiagnostics("unavailable", None)
    reason = _reasons(outcome)[1] if outcome.missed_tokens else None
    return AnthropicDiagnostics(reason, outcome.missed_tokens)


def _reasons(outcome: Outcome) -> tuple[str | None, str | None]:
    if outcome.cause == Cause.PROMPT_CHANGED:
        return _BY_PART[outcome.changed_part or RequestPart.MESSAGES]
    if outcome.cause in _KEY_CAUSES:
        return "prompt_cache_key_changed", None
    return None, None
