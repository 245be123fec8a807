"""Hits by storage tier of one server: how much its lower tiers (CPU, disk, remote) served, from the
counters its /metrics pulls said (stored raw). Per server only: no engine reports a request's tier.

Two sources, each counted in its own unit: vLLM's tiered offloading counts lookups and hits in
chunks (blocks, when a chunk is a block) per tier; LMCache counts hit tokens per level. A tier whose
series is absent had no event yet (vLLM creates a tier's series at its first one): absent is said
"not reported", never 0.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from app.domain.hitrate import counter_increase
from collectors.metrics.names import (
    LMCACHE_REQUESTED_TOKENS,
    LMCACHE_TIER_HIT_TOKENS,
    OFFLOAD_TIER_HITS,
    OFFLOAD_TIER_QUERIES,
    offload_tier,
)


@dataclass(frozen=True, slots=True)
class TierHits:
    """One lower tier's growth over a window: `hits` of `queries` (None: not counted), in `unit`."""

    tier: str  # one of collectors.metrics.names.TIERS
    source: str  # "vllm offloading" or "lmcache"
    unit: str  # "blocks" or "tokens"
    hits: float
    queries: float | None

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries else None


_SQL = """
SELECT m.id, m.name, m.labels->>'tier', ss.value FROM traffic_scrapesample ss
JOIN traffic_metricseries m ON m.id = ss.series_id
WHERE ss.server_id = %(server)s AND m.server_id = %(server)s AND m.name = ANY(%(names)s)
  AND ss.scraped_at >= %(since)s AND ss.scraped_at < %(until)s
ORDER BY m.id, ss.scraped_at
"""
_NAMES = [*OFFLOAD_TIER_QUERIES, *OFFLOAD_TIER_HITS, *LMCACHE_TIER_HIT_TOKENS, LMCACHE_REQUESTED_TOKENS]


def tier_hits(*, server_id: int, since: datetime, until: datetime) -> list[TierHits]:
    """Each lower tier's hits in [since, until), by source, in tier order; [] when none reported.
    A counter reset (a restart) counts its new value in full, series of several engines summed."""
    with connection.cursor() as cursor:
        cursor.execute(_SQL, {"server": server_id, "names": _NAMES, "since": since, "until": until})
        rows = cursor.fetchall()
    series: dict[int, tuple[str, str | None, list[float]]] = {}
    for pk, name, tier, value in rows:
        series.setdefault(pk, (name, tier, []))[2].append(value)
    grown: dict[tuple[str, str], list[float]] = {}  # (source, tier) -> [hits, queries]
    lmcache_requested = 0.0
    for name, label, values in series.values():
        growth = counter_increase(values)
        if name == LMCACHE_REQUESTED_TOKENS:
            lmcache_requested += growth
            continue
        key = ("lmcache", LMCACHE_TIER_HIT_TOKENS[name]) if name in LMCACHE_TIER_HIT_TOKENS else (
            "vllm offloading", offload_tier(label))  # fmt: skip
        counts = grown.setdefault(key, [0.0, 0.0])
        counts[0 if name in OFFLOAD_TIER_HITS or name in LMCACHE_TIER_HIT_TOKENS else 1] += growth
    return sorted(
        (TierHits(tier, source, "tokens" if source == "lmcache" else "blocks", hits,
                  lmcache_requested or None if source == "lmcache" else queries)
         for (source, tier), (hits, queries) in grown.items()),
        key=lambda found: (found.source, found.tier),
    )  # fmt: skip
