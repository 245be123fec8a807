"""A diagnosis in OpenAI's and Anthropic's cache-diagnostics shapes: every part and cause maps to a
value of each provider's enum, a hit is a hit, and a miss no structure explains has no reason."""

import pytest

from app.domain.hostedshapes import (
    ANTHROPIC_REASONS,
    OPENAI_REASONS,
    AnthropicDiagnostics,
    OpenAIDiagnostics,
    Outcome,
    anthropic_shape,
    openai_shape,
)
from app.domain.misses import Cause, RequestPart


@pytest.mark.parametrize("part", list(RequestPart))
def test_every_changed_part_maps_to_a_reason_of_each_enum(part: RequestPart) -> None:
    outcome = Outcome(diagnosed=True, cause=Cause.PROMPT_CHANGED, changed_part=part, missed_tokens=64)
    assert openai_shape(outcome).reason in OPENAI_REASONS
    assert anthropic_shape(outcome).cache_miss_reason in ANTHROPIC_REASONS


def test_a_changed_prompt_carries_its_missed_tokens_and_the_comparison_request() -> None:
    outcome = Outcome(
        diagnosed=True, cause=Cause.PROMPT_CHANGED, changed_part=RequestPart.HISTORY, missed_tokens=96,
        comparison_reusable_tokens=128, compared_with="req-7",
    )  # fmt: skip
    assert openai_shape(outcome) == OpenAIDiagnostics("cache_miss", "context_compacted", 96, 128, "req-7")
    assert anthropic_shape(outcome) == AnthropicDiagnostics("messages_changed", 96)


@pytest.mark.parametrize(
    ("outcome", "openai", "anthropic"),
    [
        (Outcome(diagnosed=False), "unavailable", "unavailable"),
        (Outcome(diagnosed=True, cause=None), "cache_hit", None),
        (Outcome(diagnosed=True, cause=Cause.EVICTED, missed_tokens=32), "unavailable", None),
        (Outcome(diagnosed=True, cause=Cause.SALT, missed_tokens=32), "cache_miss", None),
        (
            Outcome(diagnosed=True, cause=Cause.PROMPT_CHANGED, missed_tokens=32),
            "cache_miss",
            "messages_changed",
        ),
    ],
)
def test_what_no_request_part_explains_is_a_hit_or_has_no_reason(
    outcome: Outcome, openai: str, anthropic: str | None
) -> None:
    assert openai_shape(outcome).type == openai and anthropic_shape(outcome).cache_miss_reason == anthropic
