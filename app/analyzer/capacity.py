"""The what-if curve of the report: the trace's hit rate at multiples of its servers' KV blocks.

Every point from one pass over the trace (app/domain/replay/curve.py, the stack distances of
vLLM's LRU), each request on the server it was recorded on, as one replay per point would give for
requests one at a time (tests/domain/test_replay_whatif.py checks the two agree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.replay.curve import CapacityCurve
from app.domain.replay.curve import capacity_curve as one_pass_curve
from app.domain.replay.trace import TraceRequest

MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)
# Without a capacity the base is what holds the whole trace: below it the cache starts to evict.
UNLIMITED_FRACTIONS = (1 / 16, 1 / 8, 0.25, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """The replayed hit rate with `blocks` KV blocks per server (`multiplier` times the base)."""

    multiplier: float
    blocks: int
    hit_rate: float | None


def capacity_curve(
    requests: Sequence[TraceRequest],
    *,
    servers: Sequence[str],
    block_size: int,
    base_blocks: int,
    multipliers: Sequence[float],
) -> list[CurvePoint]:
    """The hit rate at each multiplier of `base_blocks` per server (at least 2 blocks each)."""
    return curve_points(one_pass_curve(requests, block_size=block_size), servers, base_blocks, multipliers)


def curve_points(
    curve: CapacityCurve, servers: Sequence[str], base_blocks: int, multipliers: Sequence[float]
) -> list[CurvePoint]:
    """The points of a curve from one pass: the same capacity on every server."""
    points = []
    for multiplier in multipliers:
        blocks = max(2, round(base_blocks * multiplier))
        points.append(CurvePoint(multiplier, blocks, curve.hit_rate_at(dict.fromkeys(servers, blocks))))
    return points
