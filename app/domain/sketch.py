"""A mergeable quantile sketch of TTFTs: log-spaced buckets (DDSketch's mapping) with a relative
error of at most RELATIVE_ACCURACY on any quantile, stored sparse ({bucket index: count}).

A value v > MIN_SECONDS falls in bucket i = ceil(log_gamma(v / MIN_SECONDS)), which holds
(MIN_SECONDS * gamma^(i-1), MIN_SECONDS * gamma^i]; the bucket's representative, 2 gamma^i / (gamma + 1)
times MIN_SECONDS, is within RELATIVE_ACCURACY of every value in it. Sketches merge by adding the
counts of each index, so a minute's sketch sums into an hour's, a server's into the fleet's, in SQL
(app/rollups/sketch_sql.py) as here. Values at or below MIN_SECONDS share bucket 0.
"""

import math
from collections.abc import Iterable, Mapping

RELATIVE_ACCURACY = 0.005
GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
MIN_SECONDS = 1e-4  # a tenth of a millisecond: any TTFT below reads as this


def bucket_index(seconds: float) -> int:
    """The bucket of one value (0 for MIN_SECONDS or less, a negative or NaN one included)."""
    if not seconds > MIN_SECONDS:
        return 0
    return max(math.ceil(math.log(seconds / MIN_SECONDS) / math.log(GAMMA)), 0)


def sketch_of(values: Iterable[float]) -> dict[int, int]:
    """The sketch of some values."""
    found: dict[int, int] = {}
    for value in values:
        index = bucket_index(value)
        found[index] = found.get(index, 0) + 1
    return found


def merged(sketches: Iterable[Mapping[int, int] | Mapping[str, int]]) -> dict[int, int]:
    """The sum of sketches (keys as stored in JSON, strings, or ints)."""
    found: dict[int, int] = {}
    for sketch in sketches:
        for key, count in sketch.items():
            found[int(key)] = found.get(int(key), 0) + int(count)
    return found


def sketch_quantile(q: float, sketch: Mapping[int, int] | Mapping[str, int]) -> float | None:
    """The q-quantile as PostgreSQL's percentile_disc takes it (the first value whose cumulative share
    of the n values reaches q: rank ceil(q n), 1-based): the representative of the bucket holding that
    value, within RELATIVE_ACCURACY of it; None when empty."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    counts = sorted((int(key), int(count)) for key, count in sketch.items() if int(count) > 0)
    total = sum(count for _, count in counts)
    if total == 0:
        return None
    rank, seen = max(math.ceil(q * total), 1), 0
    for index, count in counts:
        seen += count
        if seen >= rank:
            return _representative(index)
    return _representative(counts[-1][0])


def _representative(index: int) -> float:
    if index == 0:
        return MIN_SECONDS
    return MIN_SECONDS * 2 * GAMMA**index / (GAMMA + 1)
