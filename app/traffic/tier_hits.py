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


@dataclass(frozen=True, slots=True)
class TierCounter:
    """A server's cumulative hits (and queries) of one lower tier by one source, as last scraped:
    the engine's own counters summed over its series, so they reset when the engine restarts."""

    server: str
    model: str
    tier: str  # one of collectors.metrics.names.TIERS
    source: str  # "vllm offloading" or "lmcache"
    hits: float
    queries: float | None  # LMCache counts the tokens asked for across its levels, not per tier


_NEWEST_SQL = """
SELECT s.name, s.model, newest.name, newest.tier, newest.value FROM (
    SELECT DISTINCT ON (ss.series_id) ss.server_id, m.name, m.labels->>'tier' AS tier, ss.value
    FROM traffic_scrapesample ss JOIN traffic_metricseries m ON m.id = ss.series_id
    WHERE m.name = ANY(%(names)s) AND ss.scraped_at >= %(since)s
    ORDER BY ss.series_id, ss.scraped_at DESC
) newest JOIN fleet_server s ON s.id = newest.server_id
WHERE s.state <> 'disabled'
"""


def newest_tier_counters(*, since: datetime) -> list[TierCounter]:
    """Every server's tier counters as scraped last since `since` (one query for the fleet), in
    (server, source, tier) order; LMCache's requested tokens are each of its tiers' queries."""
    with connection.cursor() as cursor:
        cursor.execute(_NEWEST_SQL, {"names": _NAMES, "since": since})
        rows = cursor.fetchall()
    grown: dict[
        tuple[str, str, str, str], list[float]
    ] = {}  # (server, model, source, tier) -> [hits, queries]
    requested: dict[str, float] = {}
    for server, model, name, label, value in rows:
        if name == LMCACHE_REQUESTED_TOKENS:
            requested[server] = requested.get(server, 0.0) + value
            continue
        lmcache = name in LMCACHE_TIER_HIT_TOKENS
        key = (server, model, "lmcache" if lmcache else "vllm offloading",
               LMCACHE_TIER_HIT_TOKENS[name] if lmcache else offload_tier(label))  # fmt: skip
        counts = grown.setdefault(key, [0.0, 0.0])
        counts[0 if lmcache or name in OFFLOAD_TIER_HITS else 1] += value
    return [
        TierCounter(
            server, model, tier, source, hits, requested.get(server) if source == "lmcache" else queries
        )
        for (server, model, source, tier), (hits, queries) in sorted(grown.items())
    ]
