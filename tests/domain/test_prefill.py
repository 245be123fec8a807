import random
from collections.abc import Sequence

import pytest

from app.domain.prefill import MIN_SAMPLES, PrefillSums, prefill_tokens_per_second


def sums(pairs: Sequence[tuple[float, float]]) -> PrefillSums:
    return PrefillSums(
        count=len(pairs),
        x=sum(x for x, _ in pairs),
        y=sum(y for _, y in pairs),
        xx=sum(x * x for x, _ in pairs),
        xy=sum(x * y for x, y in pairs),
    )


def test_the_rate_is_the_inverse_slope_of_ttft_over_uncached_tokens_whatever_the_overhead() -> None:
    rng = random.Random(0)
    pairs = [
        (x, 0.03 + x / 8_000 + rng.gauss(0, 0.002)) for x in (rng.randrange(0, 3_000) for _ in range(500))
    ]
    assert prefill_tokens_per_second(sums(pairs)) == pytest.approx(8_000, rel=0.02)


def test_sums_of_parts_measure_what_the_whole_does() -> None:
    rng = random.Random(1)
    pairs = [(float(x), 0.01 + x / 5_000) for x in (rng.randrange(0, 2_000) for _ in range(200))]
    assert prefill_tokens_per_second(sums(pairs[:70]) + sums(pairs[70:])) == pytest.approx(5_000)


@pytest.mark.parametrize(
    "pairs",
    [
        [(float(x), x / 5_000) for x in range(MIN_SAMPLES - 1)],  # too few
        [(400.0 + (i % 3), 0.08) for i in range(100)],  # every request the same size: no slope
        [(float(x), 1.0 - x / 5_000) for x in range(0, 2_000, 10)],  # TTFT falling: queueing, not prefill
    ],
    ids=["few", "no-spread", "negative"],
)
def test_no_rate_without_the_evidence_for_one(pairs: list[tuple[float, float]]) -> None:
    assert prefill_tokens_per_second(sums(pairs)) is None
