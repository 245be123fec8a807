"""Cumulative histograms as Prometheus keeps them, and quantiles estimated from them."""

import math
from collections.abc import Sequence

# vLLM's buckets for vllm:time_to_first_token_seconds (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS_SECONDS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[int]) -> float | None:
    """The q-quantile by linear interpolation inside a bucket, as PromQL's histogram_quantile.

    `cumulative[i]` counts observations <= bounds[i]; one more final count is the +Inf bucket
    (the total). None when there are no observations. A quantile that falls in the +Inf
    bucket is reported as the highest finite bound, as Prometheus does.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    if len(cumulative) != len(bounds) + 1:
        raise ValueError("cumulative counts need one entry per bound plus the +Inf total")
    total = cumulative[-1]
    if total == 0:
        return None
    rank = q * total
    for i, count in enumerate(cumulative[:-1]):
        if count >= rank:
            lower = bounds[i - 1] if i > 0 else 0.0
            below = cumulative[i - 1] if i > 0 else 0
            in_bucket = count - below
            fraction = (rank - below) / in_bucket if in_bucket else 1.0
            return lower + (bounds[i] - lower) * fraction
    return bounds[-1] if bounds else math.nan
