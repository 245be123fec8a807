"""Hits by storage tier per server on /metrics: the lower tiers' counters (vLLM's tiered offloading,
LMCache) as each server's /metrics last said them, under a bounded `tier` label (names.TIERS)."""

from collections.abc import Iterator
from datetime import datetime, timedelta

from prometheus_client.core import CounterMetricFamily, Metric

from app.traffic.tier_hits import newest_tier_counters

# A tier counter not scraped this recently is not exported: its server stopped reporting it (or
# stopped being pulled), and ServerScrapesStale says so; an old value would read as no hits.
NEWEST_WITHIN = timedelta(minutes=10)
UNITS = {"vllm offloading": "blocks", "lmcache": "tokens"}


def tier_families(now: datetime) -> Iterator[Metric]:
    """`prefixscope_server_tier_hits_total{server, model, tier, unit}` and
    `prefixscope_server_tier_queries_total` (same labels): cumulative, as the engine counts them (a
    restart resets them); no sample for a tier the server never reported."""
    labels = ["server", "model", "tier", "unit"]
    hits = CounterMetricFamily(
        "prefixscope_server_tier_hits",
        "Prefix hits served from a tier below the GPU's cache (cpu, storage, remote, other), as the "
        "server counts them: vLLM's tiered offloading in blocks (chunks), LMCache in tokens.",
        labels=labels,
    )
    queries = CounterMetricFamily(
        "prefixscope_server_tier_queries",
        "Lookups of a lower tier, in the unit of its hits: vLLM's offloading per tier; LMCache's "
        "requested tokens, the same for each of its tiers. Tier hit rate = hits / queries.",
        labels=labels,
    )
    for found in newest_tier_counters(since=now - NEWEST_WITHIN):
        key = [found.server, found.model, found.tier, UNITS[found.source]]
        hits.add_metric(key, found.hits)
        if found.queries is not None:
            queries.add_metric(key, found.queries)
    yield from (hits, queries)
