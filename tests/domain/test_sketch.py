import math
import random

import pytest

from app.domain.histogram import TTFT_BUCKETS_SECONDS, histogram_quantile
from app.domain.sketch import RELATIVE_ACCURACY, merged, sketch_of, sketch_quantile

QUANTILES = (0.0, 0.5, 0.9, 0.99, 1.0)


def _exact(q: float, values: list[float]) -> float:
    return sorted(values)[max(math.ceil(q * len(values)), 1) - 1]  # percentile_disc


@pytest.mark.parametrize("seed", range(5))
def test_quantiles_are_within_the_relative_accuracy_of_the_exact_ones(seed: int) -> None:
    noise = random.Random(seed)
    values = [noise.lognormvariate(-2.0, 1.2) for _ in range(2000)]  # ms to seconds, a long tail
    sketch = sketch_of(values)
    for q in QUANTILES:
        assert sketch_quantile(q, sketch) == pytest.approx(_exact(q, values), rel=RELATIVE_ACCURACY)


def test_sketches_merge_as_their_values_would() -> None:
    noise = random.Random(7)
    parts = [[noise.uniform(0.1, 0.2) for _ in range(300)] for _ in range(4)]
    together = merged(
        {str(k): v for k, v in sketch_of(part).items()} for part in parts
    )  # keys as JSON stores them
    assert together == sketch_of([v for part in parts for v in part])


def test_the_fixed_buckets_missed_what_the_sketch_reads() -> None:
    values = [0.131 * (1 + i / 10_000) for i in range(100)]  # sim-3: requests of about 131 ms
    cumulative = [sum(v <= bound for v in values) for bound in TTFT_BUCKETS_SECONDS] + [len(values)]
    assert histogram_quantile(0.5, TTFT_BUCKETS_SECONDS, cumulative) == pytest.approx(0.175)
    assert sketch_quantile(0.5, sketch_of(values)) == pytest.approx(_exact(0.5, values), rel=0.01)


def test_empty_or_tiny() -> None:
    assert sketch_quantile(0.5, {}) is None
    assert sketch_quantile(0.5, sketch_of([0.0, -1.0, 1e-6])) == pytest.approx(1e-4)
