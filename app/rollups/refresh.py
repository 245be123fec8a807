"""The first-level sums, from raw rows (request records, diagnoses, the salt audit's first blocks), and
the derived sums over them (app/rollups/catalog.py, derived.py): what the pages read instead of raw rows."""

import logging
from datetime import datetime

from django.db import connection, transaction

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.rollups.catalog import Level, derived_from
from app.rollups.derived import resum, whole_periods
from app.rollups.salts import refresh_tenant_salts
from app.rollups.sketch_sql import sketches_sql, with_sketches
from app.traffic.models import (
    FUNNEL_COLUMNS,
    LOST_COLUMNS,
    LossMinute,
    MinuteRollup,
    RequestDiagnosis,
    UnsaltedPrefixMinute,
    span_only_sql,
)

logger = logging.getLogger(__name__)


def _histogram(column: str) -> str:
    """count, sum and cumulative bucket counts (the last: all) of one TTFT column, as SQL."""
    buckets = ", ".join(f"count(*) FILTER (WHERE r.{column} <= {bound!r})" for bound in TTFT_BUCKETS_SECONDS)
    return f"count(r.{column}), coalesce(sum(r.{column}), 0), ARRAY[{buckets}, count(r.{column})]"


# Records only vLLM's spans saw are no requests (span_only_sql): not in the requests or prompt tokens
# counted, their TTFT (vLLM's) in the histograms still.
_COUNTED = f"NOT {span_only_sql('r')}"
# A hosted API's requests its provider saw (not those a gateway answered from its semantic cache):
# their own hit rate, cache read / input tokens.
_HOSTED = "r.provider <> '' AND r.cached_tokens IS NOT NULL AND r.gateway_cache_hit IS NOT TRUE"
# Recomputes whole minutes from raw records, so running it twice (or concurrently with
# late arrivals, then again) converges on the same rows.
_MINUTE_TOTALS = f"""
SELECT r.server_id, r.template_id, date_trunc('minute', r.arrived_at) AS minute,
       count(*) FILTER (WHERE {_COUNTED}),
       coalesce(sum(r.prompt_tokens) FILTER (WHERE {_COUNTED}), 0), coalesce(sum(r.cached_tokens), 0),
       coalesce(sum(r.prompt_tokens) FILTER (WHERE r.cached_tokens IS NOT NULL), 0),
       coalesce(sum(r.cached_tokens) FILTER (WHERE {_HOSTED}), 0),
       coalesce(sum(r.prompt_tokens) FILTER (WHERE {_HOSTED}), 0),
       {_histogram("client_ttft_seconds")}, {_histogram("server_ttft_seconds")},
       regr_count(p.ttft, p.uncached), coalesce(sum(p.uncached) FILTER (WHERE p.ttft IS NOT NULL), 0),
       coalesce(sum(p.ttft) FILTER (WHERE p.uncached IS NOT NULL), 0),
       coalesce(sum(p.uncached * p.uncached) FILTER (WHERE p.ttft IS NOT NULL), 0),
       coalesce(sum(p.uncached * p.ttft), 0)
FROM traffic_requestrecord r,
     LATERAL (SELECT coalesce(r.server_ttft_seconds, r.client_ttft_seconds) AS ttft,
                     (r.prompt_tokens - r.cached_tokens)::float8 AS uncached) p
WHERE r.arrived_at >= %(since)s AND r.arrived_at < %(until)s
GROUP BY 1, 2, 3
"""
_MINUTE_INSERT = """
INSERT INTO traffic_minuterollup AS m (
    server_id, template_id, minute, requests, prompt_tokens, cached_tokens, cache_known_prompt_tokens,
    hosted_cached_tokens, hosted_known_prompt_tokens,
    client_ttft_count, client_ttft_sum_seconds, client_ttft_buckets,
    server_ttft_count, server_ttft_sum_seconds, server_ttft_buckets,
    prefill_count, prefill_uncached_sum, prefill_ttft_sum, prefill_uncached_squares, prefill_cross_sum,
    client_ttft_sketch, server_ttft_sketch
)"""
_MINUTE_CONFLICT = """
ON CONFLICT ON CONSTRAINT minute_rollup_identity DO UPDATE SET
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    cached_tokens = EXCLUDED.cached_tokens, cache_known_prompt_tokens = EXCLUDED.cache_known_prompt_tokens,
    hosted_cached_tokens = EXCLUDED.hosted_cached_tokens,
    hosted_known_prompt_tokens = EXCLUDED.hosted_known_prompt_tokens,
    client_ttft_count = EXCLUDED.client_ttft_count,
    client_ttft_sum_seconds = EXCLUDED.client_ttft_sum_seconds,
    client_ttft_buckets = EXCLUDED.client_ttft_buckets,
    server_ttft_count = EXCLUDED.server_ttft_count,
    server_ttft_sum_seconds = EXCLUDED.server_ttft_sum_seconds,
    server_ttft_buckets = EXCLUDED.server_ttft_buckets,
    prefill_count = EXCLUDED.prefill_count, prefill_uncached_sum = EXCLUDED.prefill_uncached_sum,
    prefill_ttft_sum = EXCLUDED.prefill_ttft_sum,
    prefill_uncached_squares = EXCLUDED.prefill_uncached_squares,
    prefill_cross_sum = EXCLUDED.prefill_cross_sum,
    client_ttft_sketch = EXCLUDED.client_ttft_sketch, server_ttft_sketch = EXCLUDED.server_ttft_sketch
"""


def _refresh_sql(*, sketches: bool) -> str:
    """The minutes' rows from the records, with their TTFT sketches unless not `sketches`."""
    found = sketches_sql("r.arrived_at >= %(since)s AND r.arrived_at < %(until)s") if sketches else None
    keys = ("server_id", "template_id", "minute")
    return with_sketches(insert=_MINUTE_INSERT, totals=_MINUTE_TOTALS, sketches=found, keys=keys) + (
        _MINUTE_CONFLICT
    )


_MINUTE_SQL = {flag: _refresh_sql(sketches=flag) for flag in (True, False)}


def whole_minutes(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """[since, until) widened to whole minutes, so that a minute is never half-counted."""
    return whole_periods(Level.MINUTE, since, until)


def whole_hours(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    return whole_periods(Level.HOUR, since, until)


REQUEST_ROLLUP_LOCK = 0x5245_5155  # pg_advisory_xact_lock's key for summing request minutes ("REQU")


def refresh_minute_rollups(*, since: datetime, until: datetime, sketches: bool = True) -> int:
    """Recompute the rollup rows of every whole minute touching [since, until), and of every whole
    hour holding those minutes; returns the minute rows written.

    `since` is rounded down and `until` up to whole minutes, so a minute is never half-counted.
    Without `sketches` the TTFT sketches are left empty: the benchmark's baseline (bench_rollups).
    """
    start, end = whole_minutes(since, until)
    with transaction.atomic(), connection.cursor() as cursor:
        # The minute task and a merge of a proposed server (or two task runs, when one outlasts its
        # minute) may sum the same hour from other minutes: one at a time, or the second's
        # DELETE-then-INSERT misses the first's new rows and its INSERT fails on them.
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [REQUEST_ROLLUP_LOCK])
        cursor.execute(_MINUTE_SQL[sketches], {"since": start, "until": end})
        written = int(cursor.rowcount)
        for rollup in derived_from(MinuteRollup):
            resum(rollup, cursor, since=start, until=end, sketches=sketches)
        refresh_unsalted_prefixes(since=start, until=end)
        refresh_tenant_salts(since=start, until=end)
        return written


_SUMMED = (*FUNNEL_COLUMNS, *LOST_COLUMNS.values())

# As _REFRESH_SQL: whole minutes recomputed from the diagnoses, so a rerun converges. Records only
# vLLM's spans saw are no requests: out of the sums (the tenant audit's among them).
_SPAN_ONLY = RequestDiagnosis.Unknown.SPAN_ONLY.value
_GATEWAY_CACHE = RequestDiagnosis.Unknown.GATEWAY_CACHE.value
_LOSS_SQL = f"""
INSERT INTO traffic_lossminute AS m (
    server_id, template_id, template_version_id, tenant, minute, requests, diagnosed, unexpected_hits,
    gateway_cache_hits, diagnosed_prompt_tokens, {", ".join(_SUMMED)}
)
SELECT d.server_id, d.template_id, d.template_version_id, d.tenant, date_trunc('minute', d.arrived_at),
       count(*), count(*) FILTER (WHERE d.unknown = ''), count(*) FILTER (WHERE d.unexpected_hit),
       count(*) FILTER (WHERE d.unknown = '{_GATEWAY_CACHE}'),
       COALESCE(sum(d.prompt_tokens) FILTER (WHERE d.unknown = ''), 0),
       {", ".join(f"sum(d.{column})" for column in _SUMMED)}
FROM traffic_requestdiagnosis d
WHERE d.arrived_at >= %(since)s AND d.arrived_at < %(until)s AND d.unknown <> '{_SPAN_ONLY}'
GROUP BY 1, 2, 3, 4, 5
ON CONFLICT ON CONSTRAINT loss_minute_identity DO UPDATE SET
    requests = EXCLUDED.requests, diagnosed = EXCLUDED.diagnosed, unexpected_hits = EXCLUDED.unexpected_hits,
    gateway_cache_hits = EXCLUDED.gateway_cache_hits,
    diagnosed_prompt_tokens = EXCLUDED.diagnosed_prompt_tokens,
    {", ".join(f"{column} = EXCLUDED.{column}" for column in _SUMMED)}
"""


LOSS_ROLLUP_LOCK = 0x4C4F_5353  # pg_advisory_xact_lock's key for summing loss minutes ("LOSS")


def refresh_loss_minutes(*, since: datetime, until: datetime) -> int:
    """Recompute the per-minute loss rows of every whole minute touching [since, until) from the
    diagnoses, and the hours holding them; returns the minute rows written. The diagnosis task
    calls it for the arrivals it just diagnosed."""
    start, end = whole_minutes(since, until)
    with transaction.atomic(), connection.cursor() as cursor:
        # Diagnosis runs of other server groups in other workers sum the same minutes: one at a time,
        # or both hours' DELETE-then-INSERT would see the same old rows and insert each hour twice.
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOSS_ROLLUP_LOCK])
        cursor.execute(_LOSS_SQL, {"since": start, "until": end})
        written = int(cursor.rowcount)
        for rollup in derived_from(LossMinute):
            resum(rollup, cursor, since=start, until=end)
        return written


# The salt audit's rollups (UnsaltedPrefixMinute, UnsaltedPrefixHour): the unsalted, tenanted records'
# first blocks per minute, tenant and template, of the first blocks two requests or more sent in the
# hour (the window sum below); whole hours are emptied and summed again, as that count is the hour's.
# The latest request of a group is the last by (arrived_at, server, request id): one rule everywhere
# (catalog.LATEST_PREFIX_BY, the same columns of the rows summed).
_LATEST_RECORD = "ORDER BY arrived_at DESC, server_id DESC, request_id DESC"
_PREFIX_COLUMNS = (
    "model, first_block, tenant, template_id, requests, last_seen_at, last_server_id, last_request_id"
)
_PREFIX_MINUTE_DELETE_SQL = (
    "DELETE FROM traffic_unsaltedprefixminute WHERE minute >= %(since)s AND minute < %(until)s"
)
PREFIX_MINUTE_SQL = f"""
INSERT INTO traffic_unsaltedprefixminute (minute, {_PREFIX_COLUMNS})
SELECT minute, {_PREFIX_COLUMNS} FROM (
    SELECT date_trunc('minute', arrived_at) AS minute, model, block_hashes[1] AS first_block, tenant,
           template_id, count(*) AS requests, max(arrived_at) AS last_seen_at,
           (array_agg(server_id {_LATEST_RECORD}))[1] AS last_server_id,
           (array_agg(request_id {_LATEST_RECORD}))[1] AS last_request_id,
           sum(count(*)) OVER (PARTITION BY date_trunc('hour', date_trunc('minute', arrived_at)), model,
                                     block_hashes[1])
               AS in_hour
    FROM traffic_requestrecord
    WHERE arrived_at >= %(since)s AND arrived_at < %(until)s AND salt_hash = '' AND tenant <> ''
      AND block_hashes[1] IS NOT NULL
    GROUP BY 1, 2, 3, 4, 5
) grouped
WHERE in_hour >= 2
"""


def refresh_unsalted_prefixes(*, since: datetime, until: datetime) -> None:
    """Recompute the unsalted prefix minutes and hours of every whole hour touching [since, until)
    from the records (whether a first block counts depends on its whole hour)."""
    start, end = whole_hours(since, until)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_PREFIX_MINUTE_DELETE_SQL, {"since": start, "until": end})
        cursor.execute(PREFIX_MINUTE_SQL, {"since": start, "until": end})
        for rollup in derived_from(UnsaltedPrefixMinute):
            resum(rollup, cursor, since=start, until=end)
