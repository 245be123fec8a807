"""Per-minute and per-hour rollups of each server's own readings (its /metrics pulls and the blocks its
KV events removed): what the Fleet page and long server series read instead of raw samples."""

from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.rollups.catalog import derived_from
from app.rollups.derived import resum
from app.rollups.refresh import whole_minutes
from app.traffic.models import KVEvent, ServerMinute
from app.traffic.residency import cached_removal_sql
from collectors.metrics.names import (
    FINISHED_REQUESTS,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
)

TTFT = "vllm:time_to_first_token_seconds"
COUNTERS = (
    *PREFIX_CACHE_QUERIES, *PREFIX_CACHE_HITS, *PREEMPTIONS, *FINISHED_REQUESTS,
    f"{TTFT}_bucket", f"{TTFT}_count", f"{TTFT}_sum",
)  # fmt: skip
# Counter growth across a longer silence (the server or the scraper away) is not counted: where it
# fell is unknown, and a minute's growth must not depend on how far back its refresh looked.
SCRAPE_GAP = timedelta(minutes=10)

# A histogram bucket's bound: its `le` label as a number (+Inf as infinity), None when not a number.
_LE = """CASE WHEN m.labels->>'le' ~ '^[0-9]+(\\.[0-9]+)?([eE][+-]?[0-9]+)?$' THEN (m.labels->>'le')::float8
              WHEN lower(m.labels->>'le') IN ('+inf', 'inf') THEN 'infinity'::float8 END"""
_BOUNDS = [*(f"{bound!r}::float8" for bound in TTFT_BUCKETS_SECONDS), "'infinity'::float8"]
_TTFT_BUCKETS = (
    "ARRAY["
    + ", ".join(
        f"round(coalesce(sum(g.growth) FILTER (WHERE g.name = '{TTFT}_bucket' AND g.le = {b}), 0))::bigint"
        for b in _BOUNDS
    )
    + "]"
)


def _growth(names: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{name}'" for name in names)
    return f"coalesce(sum(g.growth) FILTER (WHERE g.name IN ({quoted})), 0)"


_COLUMNS = (
    "scrapes", "failed_scrapes", "prefix_queries", "prefix_hits", "preemptions", "finished_requests",
    "kv_usage_sum", "kv_usage_samples", "kv_usage_max", "ttft_count", "ttft_sum_seconds", "ttft_buckets",
    "evictions",
)  # fmt: skip

# Whole minutes recomputed from the raw rows, so a rerun (or one overlapping late rows) converges.
_MINUTE_SQL = f"""
WITH samples AS (
    SELECT ss.server_id, ss.series_id, ss.scraped_at, ss.value,
           ss.value - lag(ss.value) OVER w AS delta, ss.scraped_at - lag(ss.scraped_at) OVER w AS since_last
    FROM traffic_scrapesample ss
    WHERE ss.series_id IN (SELECT id FROM traffic_metricseries WHERE name = ANY(%(counters)s))
      AND ss.scraped_at >= %(lookback)s AND ss.scraped_at < %(until)s
    WINDOW w AS (PARTITION BY ss.series_id ORDER BY ss.scraped_at)
), g AS (
    SELECT s.server_id, date_trunc('minute', s.scraped_at) AS minute, m.name, {_LE} AS le,
           CASE WHEN s.delta < 0 THEN s.value ELSE s.delta END AS growth
    FROM samples s JOIN traffic_metricseries m ON m.id = s.series_id
    WHERE s.scraped_at >= %(since)s AND s.delta IS NOT NULL AND s.since_last <= %(gap)s
), counters AS (
    SELECT g.server_id, g.minute, {_growth(PREFIX_CACHE_QUERIES)} AS prefix_queries,
           {_growth(PREFIX_CACHE_HITS)} AS prefix_hits, {_growth(PREEMPTIONS)} AS preemptions,
           {_growth(FINISHED_REQUESTS)} AS finished_requests, {_growth((f"{TTFT}_count",))} AS ttft_count,
           {_growth((f"{TTFT}_sum",))} AS ttft_sum_seconds, {_TTFT_BUCKETS} AS ttft_buckets
    FROM g GROUP BY 1, 2
), usage AS (
    SELECT ss.server_id, date_trunc('minute', ss.scraped_at) AS minute, sum(ss.value) AS kv_usage_sum,
           count(*) AS kv_usage_samples, max(ss.value) AS kv_usage_max
    FROM traffic_scrapesample ss
    WHERE ss.series_id IN (SELECT id FROM traffic_metricseries WHERE name = %(usage)s)
      AND ss.scraped_at >= %(since)s AND ss.scraped_at < %(until)s
    GROUP BY 1, 2
), pulls AS (
    SELECT server_id, date_trunc('minute', scraped_at) AS minute, count(*) AS scrapes,
           count(*) FILTER (WHERE NOT ok) AS failed_scrapes
    FROM traffic_scrape WHERE scraped_at >= %(since)s AND scraped_at < %(until)s GROUP BY 1, 2
), evictions AS (
    SELECT server_id, date_trunc('minute', emitted_at) AS minute, count(*) AS evictions
    FROM traffic_kvevent
    WHERE kind = {int(KVEvent.Kind.REMOVED)} AND emitted_at >= %(since)s AND emitted_at < %(until)s
      AND {cached_removal_sql()}
    GROUP BY 1, 2
)
INSERT INTO traffic_serverminute (server_id, minute, {", ".join(_COLUMNS)})
SELECT server_id, minute, coalesce(scrapes, 0), coalesce(failed_scrapes, 0), coalesce(prefix_queries, 0),
       coalesce(prefix_hits, 0), coalesce(preemptions, 0), coalesce(finished_requests, 0),
       coalesce(kv_usage_sum, 0), coalesce(kv_usage_samples, 0), kv_usage_max, coalesce(ttft_count, 0),
       coalesce(ttft_sum_seconds, 0), coalesce(ttft_buckets, '{{}}'), coalesce(evictions, 0)
FROM pulls FULL JOIN counters USING (server_id, minute) FULL JOIN usage USING (server_id, minute)
     FULL JOIN evictions USING (server_id, minute)
ON CONFLICT (server_id, minute) DO UPDATE SET
    {", ".join(f"{column} = EXCLUDED.{column}" for column in _COLUMNS)}
"""

SERVER_ROLLUP_LOCK = 0x5352_5655  # pg_advisory_xact_lock's key for summing server minutes ("SRVU")


def refresh_server_minutes(*, since: datetime, until: datetime) -> int:
    """Recompute every server's rows of the whole minutes touching [since, until) from its raw pulls,
    samples and KV events, and the hours holding those minutes; returns the minute rows written.

    A minute with nothing in it gets no row (a server not pulled then is unknown, not zero). Refresh
    recent minutes only: a minute's KV events are kept for hours, and its evictions are recounted.
    """
    start, end = whole_minutes(since, until)
    params: dict[str, Any] = {"since": start, "until": end, "lookback": start - SCRAPE_GAP, "gap": SCRAPE_GAP,
              "counters": list(COUNTERS), "usage": KV_USAGE}  # fmt: skip
    with transaction.atomic(), connection.cursor() as cursor:
        # Two task runs (one outlasting its minute) sum the same hours: one at a time, as the request
        # rollups (rollups.refresh_minute_rollups).
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SERVER_ROLLUP_LOCK])
        cursor.execute(_MINUTE_SQL, params)
        written = int(cursor.rowcount)
        for rollup in derived_from(ServerMinute):
            resum(rollup, cursor, since=start, until=end)
        return written
