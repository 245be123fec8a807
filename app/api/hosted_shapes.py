"""A request's diagnosis in OpenAI's and Anthropic's cache-diagnostics shapes (the mapping, with
its sources, is app/domain/hostedshapes.py)."""

from ninja import Field, Schema

from app.domain.hostedshapes import (
    ANTHROPIC_REASONS,
    OPENAI_REASONS,
    Outcome,
    anthropic_shape,
    openai_shape,
)
from app.domain.misses import Cause, RequestPart, is_loss
from app.traffic.models import RequestDiagnosis, RequestRecord


class OpenAIPromptCacheDiagnostics(Schema):
    type: str = Field(description="cache_hit | cache_miss | comparison_response_not_found | unavailable")
    reason: str | None = Field(None, description="cache_miss: one of " + ", ".join(OPENAI_REASONS))
    cache_missed_tokens: int | None = Field(None, description="cache_miss: reusable prompt tokens not reused")
    comparison_reusable_tokens: int | None = Field(
        None, description="cache_miss: leading tokens the comparison request had as this one (block-rounded)"
    )
    comparison_request_id: str | None = Field(
        None, description="the earlier request this one was compared with (OpenAI: the comparison response)"
    )


class AnthropicCacheDiagnostics(Schema):
    cache_miss_reason: str | None = Field(
        description="one of " + ", ".join(ANTHROPIC_REASONS) + "; null when the structure did not change"
    )
    cache_missed_input_tokens: int | None


def outcome_of(record: RequestRecord, diagnosis: RequestDiagnosis | None) -> Outcome:
    """What the hosted shapes read of a request's diagnosis."""
    if diagnosis is None or diagnosis.unknown:
        return Outcome(diagnosed=False)
    cause = Cause(diagnosis.cause) if diagnosis.cause else None
    missed = sum(loss.tokens for loss in diagnosis.loss_runs if is_loss(loss.cause))
    size = record.server.block_size or 1
    changed_from = diagnosis.changed_from
    comparison = (changed_from // size) * size if changed_from is not None else diagnosis.seen_before_tokens
    return Outcome(
        diagnosed=True,
        cause=cause,
        changed_part=RequestPart(diagnosis.changed_part) if diagnosis.changed_part else None,
        missed_tokens=missed,
        comparison_reusable_tokens=comparison,
        compared_with=diagnosis.compared_with,
    )


def openai_diagnostics(outcome: Outcome) -> OpenAIPromptCacheDiagnostics:
    shaped = openai_shape(outcome)
    return OpenAIPromptCacheDiagnostics(
        type=shaped.type, reason=shaped.reason, cache_missed_tokens=shaped.cache_missed_tokens,
        comparison_reusable_tokens=shaped.comparison_reusable_tokens,
        comparison_request_id=shaped.comparison_request_id,
    )  # fmt: skip


def anthropic_diagnostics(outcome: Outcome) -> AnthropicCacheDiagnostics:
    shaped = anthropic_shape(outcome)
    return AnthropicCacheDiagnostics(
        cache_miss_reason=shaped.cache_miss_reason, cache_missed_input_tokens=shaped.cache_missed_input_tokens
    )
