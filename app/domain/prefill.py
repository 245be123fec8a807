"""A prefill rate measured from traffic: the slope of time to first token over uncached prompt tokens.

A request's TTFT is its queueing, a fixed overhead, and its prefill, which grows with the prompt tokens
the cache did not have; across many requests the least-squares slope of TTFT over uncached tokens is
seconds per prefilled token, its inverse the rate. The sums come from the per-minute rollups, so any
scope and window adds them up without reading a raw row.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SAMPLES = 30  # requests with both a TTFT and known cached tokens
MIN_SPREAD_TOKENS = 32.0  # the uncached tokens' standard deviation: below it, no slope to speak of


@dataclass(frozen=True, slots=True)
class PrefillSums:
    """Sums over requests of x = uncached prompt tokens and y = TTFT seconds."""

    count: int = 0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def __add__(self, other: PrefillSums) -> PrefillSums:
        return PrefillSums(
            self.count + other.count,
            self.x + other.x,
            self.y + other.y,
            self.xx + other.xx,
            self.xy + other.xy,
        )


def prefill_tokens_per_second(sums: PrefillSums) -> float | None:
    """The inverse of the least-squares slope of TTFT over uncached tokens; None with fewer than
    MIN_SAMPLES requests, uncached tokens that hardly vary (every request a hit, or every one a
    miss of one size), or a slope that is not positive (queueing swamped the prefill)."""
    if sums.count < MIN_SAMPLES:
        return None
    mean_x, mean_y = sums.x / sums.count, sums.y / sums.count
    variance = sums.xx / sums.count - mean_x * mean_x
    if variance < MIN_SPREAD_TOKENS**2:
        return None
    slope = (sums.xy / sums.count - mean_x * mean_y) / variance
    return 1.0 / slope if slope > 0 else None
