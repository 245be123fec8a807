"""How long one server's KV blocks stay resident: read from its KV events over a bounded recent
window (there is no residency rollup), and from vLLM's own block histograms where it exposes them.

KV events say when a block was stored and removed, so they give its lifetime; when it was last read
they do not say (hits are not on the stream), so idle-before-eviction and the reuse gap come only
from vLLM's `vllm:kv_block_*` histograms, which it exposes with --kv-cache-metrics (sampled blocks).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from app.domain.histogram import histogram_quantile
from app.domain.hitrate import counter_increase
from app.domain.tiers import FALLBACK_ATTENTION_GROUP, GPU, NOT_CACHED
from app.fleet.models import Server
from app.traffic.models import KVEvent

# At most this much of the stream is read, and at most this many removals: the page stays fast
# whatever the window, and says which span its figures cover.
EVENTS_WINDOW = timedelta(hours=1)
MAX_REMOVALS = 20_000

ENGINE_HISTOGRAMS = {
    "lifetime": "vllm:kv_block_lifetime_seconds_bucket",
    "idle_before_eviction": "vllm:kv_block_idle_before_evict_seconds_bucket",
    "reuse_gap": "vllm:kv_block_reuse_gap_seconds_bucket",
}


@dataclass(frozen=True, slots=True)
class Spread:
    """Quantiles of a duration in seconds over `count` observations (None: none observed)."""

    count: int
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class Residency:
    since: datetime  # the span the KV-event lifetimes cover
    until: datetime
    event_lifetime: Spread  # stored -> removed, from KV events
    engine: dict[str, Spread | None]  # vLLM's histograms over the page's window; None: not exposed


# GPU memory's blocks of the attention group only (app/domain/tiers.py is_residency): a CPU copy or
# another KV-cache group's block of the same hash has a lifetime of its own.
def gpu_attention_sql(alias: str) -> str:
    """The SQL condition that a traffic_kvevent row (as `alias`) is a GPU block of the server's
    attention group (the query's %(attention)s: Server.attention_group)."""
    return (f"upper({alias}.medium) IN ('', '{GPU}')"
            f" AND COALESCE({alias}.group_idx, %(attention)s) = %(attention)s"
            f" AND {cached_removal_sql(f'{alias}.removal_reason')}")  # fmt: skip


def cached_removal_sql(column: str = "removal_reason") -> str:
    """The SQL condition that a traffic_kvevent row's removal reason (`column`) is not a request's
    own blocks freed as it ended (app/domain/tiers.py NOT_CACHED): true for every other row."""
    return f"COALESCE({column}, -1) NOT IN ({', '.join(str(int(r)) for r in sorted(NOT_CACHED))})"


_LIFETIME_SQL = f"""
WITH removed AS (
    SELECT dp_rank, epoch, block_hash, emitted_at FROM traffic_kvevent k
    WHERE server_id = %(server)s AND kind = {int(KVEvent.Kind.REMOVED)}
      AND emitted_at >= %(since)s AND emitted_at < %(until)s AND {gpu_attention_sql("k")}
    ORDER BY emitted_at DESC LIMIT {MAX_REMOVALS}
), lived AS (
    SELECT extract(epoch FROM r.emitted_at - s.stored_at) AS seconds
    FROM removed r, LATERAL (
        SELECT max(e.emitted_at) AS stored_at FROM traffic_kvevent e
        WHERE e.server_id = %(server)s AND e.block_hash = r.block_hash AND e.kind = {int(KVEvent.Kind.STORED)}
          AND e.dp_rank = r.dp_rank AND e.epoch = r.epoch AND {gpu_attention_sql("e")}
          AND e.emitted_at <= r.emitted_at AND e.emitted_at >= %(stored_since)s
    ) s
    WHERE s.stored_at IS NOT NULL
)
SELECT count(*), percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY seconds) FROM lived
"""


def block_residency(*, server_id: int, since: datetime, until: datetime) -> Residency:
    """Block lifetimes of the blocks removed in the last EVENTS_WINDOW of [since, until) (the
    latest MAX_REMOVALS of them; a block stored before the events kept is left out), and vLLM's
    own histograms over the whole window."""
    events_since = max(since, until - EVENTS_WINDOW)
    server = Server.objects.only("kv_cache_groups").filter(pk=server_id).first()
    attention = server.attention_group if server else FALLBACK_ATTENTION_GROUP
    params: dict[str, Any] = {"server": server_id, "since": events_since, "until": until,
              "stored_since": events_since - EVENTS_WINDOW, "attention": attention}  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_LIFETIME_SQL, params)
        count, quantiles = cursor.fetchone()
    p50, p90, p99 = quantiles or (None, None, None)
    engine = {
        name: _engine_spread(server_id, metric, since=since, until=until)
        for name, metric in ENGINE_HISTOGRAMS.items()
    }
    return Residency(events_since, until, Spread(count, p50, p90, p99), engine)


_HISTOGRAM_SQL = """
SELECT m.id, m.labels->>'le', ss.value FROM traffic_scrapesample ss
JOIN traffic_metricseries m ON m.id = ss.series_id
WHERE ss.server_id = %(server)s AND m.name = %(name)s
  AND ss.scraped_at >= %(since)s AND ss.scraped_at < %(until)s
ORDER BY m.id, ss.scraped_at
"""


def _engine_spread(server_id: int, name: str, *, since: datetime, until: datetime) -> Spread | None:
    """Quantiles of what one of vLLM's histograms observed in the window (growth of each `le`
    bucket, a reset counting in full, engines summed); None when the server does not expose it."""
    with connection.cursor() as cursor:
        cursor.execute(_HISTOGRAM_SQL, {"server": server_id, "name": name, "since": since, "until": until})
        rows = cursor.fetchall()
    if not rows:
        return None
    values: dict[tuple[int, float], list[float]] = {}
    for series_id, le, value in rows:
        values.setdefault((series_id, float(le)), []).append(value)
    grown: dict[float, float] = {}
    for (_, bound), series in values.items():
        grown[bound] = grown.get(bound, 0.0) + counter_increase(series)
    bounds = sorted(b for b in grown if b != float("inf"))
    cumulative = [round(grown[b]) for b in bounds] + [round(grown.get(float("inf"), 0.0))]
    quantiles = [histogram_quantile(q, bounds, cumulative) for q in (0.5, 0.9, 0.99)]
    return Spread(cumulative[-1], *quantiles)


@dataclass(frozen=True, slots=True)
class ResidentShare:
    """What a server's prefix cache holds now, from its KV events (the block index): `blocks` resident
    (stored and not removed since) of its `usable` KV blocks (vLLM's null block left out, per engine
    times the data-parallel ranks seen). vLLM's own kv_cache_usage_perc counts only the blocks running
    requests hold: a cached block no request holds is free to it (evictable), so usage reads 0 between
    requests while this share can be near 100 %."""

    blocks: int
    usable: int | None  # None: the server's KV blocks are not known (no cache_config_info read yet)

    @property
    def share(self) -> float | None:
        return min(self.blocks / self.usable, 1.0) if self.usable else None

    @property
    def percent(self) -> float | None:
        return None if self.share is None else 100 * self.share


def resident_shares(servers: Iterable[Server]) -> dict[int, ResidentShare]:
    """Each server's resident prefix blocks now, one query for all (servers without events: 0): the
    counts its KV streams keep (KVStream.resident_blocks), not a count of the block index."""
    found = {server.pk: server for server in servers}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT server_id, sum(resident_blocks), count(*) FILTER (WHERE resident_blocks > 0)"
            " FROM traffic_kvstream WHERE server_id = ANY(%s) GROUP BY server_id",
            [list(found)],
        )
        counted = {server_id: (blocks, ranks) for server_id, blocks, ranks in cursor.fetchall()}
    shares = {}
    for pk, server in found.items():
        blocks, ranks = counted.get(pk, (0, 1))
        blocks, ranks = int(blocks), ranks or 1  # sum() of bigints is numeric; no rank holding any: one
        usable = (
            (server.num_gpu_blocks - 1) * ranks
            if server.num_gpu_blocks and server.num_gpu_blocks > 1
            else None
        )
        shares[pk] = ResidentShare(blocks, usable)
    return shares
