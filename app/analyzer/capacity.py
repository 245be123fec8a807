"""The what-if curve of the report: the trace's hit rate at multiples of its servers' KV blocks.

One replay (app/domain/replay/run.py) per point, routing as recorded. The domain's one-pass
capacity curve, when it lands, computes the same points in one pass: this function is the one
place to call it from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.replay.run import ServerShape, Setup, replay
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
    points = []
    for multiplier in multipliers:
        blocks = max(2, round(base_blocks * multiplier))
        setup = Setup(servers=tuple(ServerShape(name, blocks) for name in servers), block_size=block_size)
        points.append(CurvePoint(multiplier, blocks, replay(requests, setup).hit_rate))
    return points
