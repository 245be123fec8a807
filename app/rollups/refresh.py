"""Per-minute rollups of request records and of their diagnoses: what dashboards read instead of raw rows."""

import logging
from datetime import datetime, timedelta

from django.db import connection, transaction

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.rollups.salts import refresh_tenant_salts
from app.rollups.sketch_sql import sketches_sql, summed_sketches_sql, with_sketches
from app.traffic.models import RequestDiagnosis, span_only_sql

logger = logging.getLogger(__name__)


def _histogram(column: str) -> str:
    """count, sum and cumulative bucket counts (the last: all) of one TTFT column, as SQL."""
    buckets = ", ".join(f"count(*) FILTER (WHERE r.{column} <= {bound!r})" for bound in TTFT_BUCKETS_SECONDS)
    return f"count(r.{column}), coalesce(sum(r.{column}), 0), ARRAY[{buckets}, count(r.{column})]"


# Records only vLLM's spans saw are no requests (span_only_sql): not in the requests or prompt tokens
# counted, their TTFT (vLLM's) in the histograms still.
_COUNTED = f"NOT {span_only_sql('r')}"
# Recomputes whole minutes from raw records, so running it twice (or concurrently with
# late arrivals, then again) converges on the same rows.
_MINUTE_TOTALS = f"""
SELECT r.server_id, r.template_id, date_trunc('minute', r.arrived_at) AS minute,
       count(*) FILTER (WHERE {_COUNTED}),
       coalesce(sum(r.prompt_tokens) FILTER (WHERE {_COUNTED}), 0), coalesce(sum(r.cached_tokens), 0),
       coalesce(sum(r.prompt_tokens) FILTER (WHERE r.cached_tokens IS NOT NULL), 0),
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
    client_ttft_count, client_ttft_sum_seconds, client_ttft_buckets,
    server_ttft_count, server_ttft_sum_seconds, server_ttft_buckets,
    prefill_count, prefill_uncached_sum, prefill_ttft_sum, prefill_uncached_squares, prefill_cross_sum,
    client_ttft_sketch, server_ttft_sketch
)"""
_MINUTE_CONFLICT = """
ON CONFLICT ON CONSTRAINT minute_rollup_identity DO UPDATE SET
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    cached_tokens = EXCLUDED.cached_tokens, cache_known_prompt_tokens = EXCLUDED.cache_known_prompt_tokens,
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


def _minute_floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def whole_minutes(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """[since, until) widened to whole minutes, so that a minute is never half-counted."""
    end = _minute_floor(until)
    return _minute_floor(since), end + timedelta(minutes=1) if until != end else end


_TOTALS = (
    "requests", "prompt_tokens", "cached_tokens", "cache_known_prompt_tokens", "client_ttft_count",
    "client_ttft_sum_seconds", "server_ttft_count", "server_ttft_sum_seconds", "prefill_count",
    "prefill_uncached_sum", "prefill_ttft_sum", "prefill_uncached_squares", "prefill_cross_sum",
)  # fmt: skip


def _summed_histogram(column: str) -> str:
    """Cumulative bucket counts summed position by position over the rows grouped."""
    return (
        "ARRAY["
        + ", ".join(f"coalesce(sum({column}[{i}]), 0)" for i in range(1, len(TTFT_BUCKETS_SECONDS) + 2))
        + "]"
    )


# The sums of the request rollups, emptied and summed again (_request_sql): the minutes of each server
# over its templates (ServerRequestMinute: the Fleet page's minutes), the hours from their minutes
# (HourRollup), of each server over its templates (ServerRequestHour: the Fleet page and fleet
# series) and of each template over servers (TemplateRequestHour: the Templates list and pages).
_SERVER_MINUTE_DELETE_SQL = (
    "DELETE FROM traffic_serverrequestminute WHERE minute >= %(since)s AND minute < %(until)s"
)
_HOUR_DELETE_SQL = "DELETE FROM traffic_hourrollup WHERE hour >= %(since)s AND hour < %(until)s"
_SERVER_HOUR_DELETE_SQL = "DELETE FROM traffic_serverrequesthour WHERE hour >= %(since)s AND hour < %(until)s"
_TEMPLATE_HOUR_DELETE_SQL = (
    "DELETE FROM traffic_templaterequesthour WHERE hour >= %(since)s AND hour < %(until)s"
)


def whole_hours(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    start = since.replace(minute=0, second=0, microsecond=0)
    end = until.replace(minute=0, second=0, microsecond=0)
    return start, end + timedelta(hours=1) if until != end else end


REQUEST_ROLLUP_LOCK = 0x5245_5155  # pg_advisory_xact_lock's key for summing request minutes ("REQU")


_MINUTES = "minute >= %(since)s AND minute < %(until)s"
_HOURS = "hour >= %(since)s AND hour < %(until)s"


def _summed_sql(target: str, keys: dict[str, str], source: str, where: str, *, sketches: bool) -> str:
    """An INSERT into `target` of `source`'s rows matching `where` summed per `keys` ({column:
    expression over `source`}): the totals, the histograms position by position and (when
    `sketches`) the TTFT sketches index by index."""
    names = ", ".join(keys)
    grouped = ", ".join(f"{expr} AS {name}" for name, expr in keys.items())
    totals = f"""
SELECT {grouped}, {", ".join(f"sum({c})" for c in _TOTALS)},
       {_summed_histogram("client_ttft_buckets")}, {_summed_histogram("server_ttft_buckets")}
FROM {source} WHERE {where}
GROUP BY {", ".join(str(n) for n in range(1, len(keys) + 1))}"""
    insert = f"""
INSERT INTO {target} ({names}, {", ".join(_TOTALS)}, client_ttft_buckets, server_ttft_buckets,
                      client_ttft_sketch, server_ttft_sketch)"""
    found = summed_sketches_sql(table=source, keys=keys, where=where) if sketches else None
    return with_sketches(insert=insert, totals=totals, sketches=found, keys=tuple(keys))


def _request_sql(*, sketches: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What refresh_minute_rollups runs: the statements over whole minutes, then over whole hours
    (ServerRequestMinute, HourRollup, ServerRequestHour and TemplateRequestHour each emptied and
    summed again: a row converges on what it sums, even when a group has nothing left in it)."""
    server, template = {"server_id": "server_id"}, {"template_id": "template_id"}
    hour = {"hour": "date_trunc('hour', minute)"}
    minutes = (
        _refresh_sql(sketches=sketches),
        _SERVER_MINUTE_DELETE_SQL,
        _summed_sql("traffic_serverrequestminute", {**server, "minute": "minute"}, "traffic_minuterollup",
                    _MINUTES, sketches=sketches),
    )  # fmt: skip
    hours = (
        _HOUR_DELETE_SQL,
        _summed_sql("traffic_hourrollup", {**server, **template, **hour}, "traffic_minuterollup", _MINUTES,
                    sketches=sketches),
        _SERVER_HOUR_DELETE_SQL,
        _summed_sql("traffic_serverrequesthour", {**server, "hour": "hour"}, "traffic_hourrollup", _HOURS,
                    sketches=sketches),
        _TEMPLATE_HOUR_DELETE_SQL,
        _summed_sql("traffic_templaterequesthour", {**template, "hour": "hour"}, "traffic_hourrollup",
                    f"{_HOURS} AND template_id IS NOT NULL", sketches=sketches),
    )  # fmt: skip
    return minutes, hours


_REQUEST_SQL = {flag: _request_sql(sketches=flag) for flag in (True, False)}


def refresh_minute_rollups(*, since: datetime, until: datetime, sketches: bool = True) -> int:
    """Recompute the rollup rows of every whole minute touching [since, until), and of every whole
    hour holding those minutes; returns the minute rows written.

    `since` is rounded down and `until` up to whole minutes, so a minute is never half-counted.
    Without `sketches` the TTFT sketches are left empty: the benchmark's baseline (bench_rollups).
    """
    start, end = whole_minutes(since, until)
    hours_start, hours_end = whole_hours(start, end)
    (first, *minute_sql), hour_sql = _REQUEST_SQL[sketches]
    with transaction.atomic(), connection.cursor() as cursor:
        # The minute task and a merge of a proposed server (or two task runs, when one outlasts its
        # minute) may sum the same hour from other minutes: one at a time, or the second's
        # DELETE-then-INSERT misses the first's new rows and its INSERT fails on them.
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [REQUEST_ROLLUP_LOCK])
        cursor.execute(first, {"since": start, "until": end})
        written = int(cursor.rowcount)
        for sql in minute_sql:
            cursor.execute(sql, {"since": start, "until": end})
        for sql in hour_sql:
            cursor.execute(sql, {"since": hours_start, "until": hours_end})
        refresh_unsalted_prefixes(since=start, until=end)
        refresh_tenant_salts(since=start, until=end)
        return written


_FUNNEL = (
    "prompt_tokens",
    "seen_before_tokens",
    "resident_anywhere_tokens",
    "resident_here_tokens",
    "reused_tokens",
)
_LOST = tuple(f"{cause.value}_tokens" for cause in RequestDiagnosis.Cause)
_SUMMED = _FUNNEL + _LOST

# As _REFRESH_SQL: whole minutes recomputed from the diagnoses, so a rerun converges. Records only
# vLLM's spans saw are no requests: out of the sums (the tenant audit's among them).
_SPAN_ONLY = RequestDiagnosis.Unknown.SPAN_ONLY.value
_LOSS_SQL = f"""
INSERT INTO traffic_lossminute AS m (
    server_id, template_id, template_version_id, tenant, minute, requests, diagnosed, unexpected_hits,
    diagnosed_prompt_tokens, {", ".join(_SUMMED)}
)
SELECT d.server_id, d.template_id, d.template_version_id, d.tenant, date_trunc('minute', d.arrived_at),
       count(*), count(*) FILTER (WHERE d.unknown = ''), count(*) FILTER (WHERE d.unexpected_hit),
       COALESCE(sum(d.prompt_tokens) FILTER (WHERE d.unknown = ''), 0),
       {", ".join(f"sum(d.{column})" for column in _SUMMED)}
FROM traffic_requestdiagnosis d
WHERE d.arrived_at >= %(since)s AND d.arrived_at < %(until)s AND d.unknown <> '{_SPAN_ONLY}'
GROUP BY 1, 2, 3, 4, 5
ON CONFLICT ON CONSTRAINT loss_minute_identity DO UPDATE SET
    requests = EXCLUDED.requests, diagnosed = EXCLUDED.diagnosed, unexpected_hits = EXCLUDED.unexpected_hits,
    diagnosed_prompt_tokens = EXCLUDED.diagnosed_prompt_tokens,
    {", ".join(f"{column} = EXCLUDED.{column}" for column in _SUMMED)}
"""


_LOSS_TOTALS = ("requests", "diagnosed", "unexpected_hits", "diagnosed_prompt_tokens", *_SUMMED)
# As HOUR_SQL: the hours emptied and summed again from their minutes.
_LOSS_HOUR_DELETE_SQL = "DELETE FROM traffic_losshour WHERE hour >= %(since)s AND hour < %(until)s"
LOSS_HOUR_SQL = f"""
INSERT INTO traffic_losshour (server_id, template_id, template_version_id, tenant, hour,
                              {", ".join(_LOSS_TOTALS)})
SELECT server_id, template_id, template_version_id, tenant, date_trunc('hour', minute),
       {", ".join(f"sum({c})" for c in _LOSS_TOTALS)}
FROM traffic_lossminute WHERE minute >= %(since)s AND minute < %(until)s
GROUP BY 1, 2, 3, 4, 5
"""


# The loss hours of each server and tenant summed over templates and versions (ServerLossHour).
_SERVER_LOSS_HOUR_DELETE_SQL = (
    "DELETE FROM traffic_serverlosshour WHERE hour >= %(since)s AND hour < %(until)s"
)
SERVER_LOSS_HOUR_SQL = f"""
INSERT INTO traffic_serverlosshour (server_id, tenant, hour, {", ".join(_LOSS_TOTALS)})
SELECT server_id, tenant, hour, {", ".join(f"sum({c})" for c in _LOSS_TOTALS)}
FROM traffic_losshour WHERE hour >= %(since)s AND hour < %(until)s
GROUP BY 1, 2, 3
"""


# The loss minutes of each server and tenant summed per quarter hour (ServerLossQuarter): the
# quarters emptied and summed again from their minutes, as the hours are.
QUARTER = timedelta(minutes=15)
_QUARTER_DELETE_SQL = "DELETE FROM traffic_serverlossquarter WHERE minute >= %(since)s AND minute < %(until)s"
SERVER_LOSS_QUARTER_SQL = f"""
INSERT INTO traffic_serverlossquarter (server_id, tenant, minute, {", ".join(_LOSS_TOTALS)})
SELECT server_id, tenant, date_bin('15 minutes', minute, TIMESTAMPTZ '2000-01-01'),
       {", ".join(f"sum({c})" for c in _LOSS_TOTALS)}
FROM traffic_lossminute WHERE minute >= %(since)s AND minute < %(until)s
GROUP BY 1, 2, 3
"""


def whole_quarters(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """[since, until) widened to whole quarter hours (:00, :15, :30, :45)."""
    start = since.replace(minute=since.minute - since.minute % 15, second=0, microsecond=0)
    end = until.replace(minute=until.minute - until.minute % 15, second=0, microsecond=0)
    return start, end + QUARTER if until != end else end


# The hours of each template and tenant summed over servers and versions (TemplateLossHour), from the
# hour rollups just summed: emptied and summed again as they are (what a template's page reads).
_TEMPLATE_LOSS_HOUR_DELETE_SQL = (
    "DELETE FROM traffic_templatelosshour WHERE hour >= %(since)s AND hour < %(until)s"
)
TEMPLATE_LOSS_HOUR_SQL = f"""
INSERT INTO traffic_templatelosshour (template_id, hour, tenant, {", ".join(_LOSS_TOTALS)})
SELECT template_id, hour, tenant, {", ".join(f"sum({c})" for c in _LOSS_TOTALS)}
FROM traffic_losshour WHERE hour >= %(since)s AND hour < %(until)s AND template_id IS NOT NULL
GROUP BY 1, 2, 3
"""

# The minutes of each server and tenant summed over templates and versions, in the transaction
# that writes the minutes they sum: emptied and summed again as the hours are, so that a minute
# converges on its rows (ServerLossMinute: the Fleet page's minutes).
_SERVER_LOSS_MINUTE_DELETE_SQL = (
    "DELETE FROM traffic_serverlossminute WHERE minute >= %(since)s AND minute < %(until)s"
)
SERVER_LOSS_MINUTE_SQL = f"""
INSERT INTO traffic_serverlossminute (server_id, tenant, minute, {", ".join(_LOSS_TOTALS)})
SELECT server_id, tenant, minute, {", ".join(f"sum({c})" for c in _LOSS_TOTALS)}
FROM traffic_lossminute WHERE minute >= %(since)s AND minute < %(until)s
GROUP BY 1, 2, 3
"""


LOSS_ROLLUP_LOCK = 0x4C4F_5353  # pg_advisory_xact_lock's key for summing loss minutes ("LOSS")


def refresh_loss_minutes(*, since: datetime, until: datetime) -> int:
    """Recompute the per-minute loss rows of every whole minute touching [since, until) from the
    diagnoses, and the hours holding them; returns the minute rows written. The diagnosis task
    calls it for the arrivals it just diagnosed."""
    start, end = whole_minutes(since, until)
    hours_start, hours_end = whole_hours(start, end)
    with transaction.atomic(), connection.cursor() as cursor:
        # Diagnosis runs of other server groups in other workers sum the same minutes: one at a time,
        # or both hours' DELETE-then-INSERT would see the same old rows and insert each hour twice.
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOSS_ROLLUP_LOCK])
        cursor.execute(_LOSS_SQL, {"since": start, "until": end})
        written = int(cursor.rowcount)
        cursor.execute(_SERVER_LOSS_MINUTE_DELETE_SQL, {"since": start, "until": end})
        cursor.execute(SERVER_LOSS_MINUTE_SQL, {"since": start, "until": end})
        hours = {"since": hours_start, "until": hours_end}
        cursor.execute(_LOSS_HOUR_DELETE_SQL, hours)
        cursor.execute(LOSS_HOUR_SQL, hours)
        cursor.execute(_SERVER_LOSS_HOUR_DELETE_SQL, hours)
        cursor.execute(SERVER_LOSS_HOUR_SQL, hours)
        cursor.execute(_TEMPLATE_LOSS_HOUR_DELETE_SQL, hours)
        cursor.execute(TEMPLATE_LOSS_HOUR_SQL, hours)
        quarters = dict(zip(("since", "until"), whole_quarters(start, end), strict=True))
        cursor.execute(_QUARTER_DELETE_SQL, quarters)
        cursor.execute(SERVER_LOSS_QUARTER_SQL, quarters)
        return written


# The salt audit's rollups (UnsaltedPrefixMinute, UnsaltedPrefixHour): the unsalted, tenanted records'
# first blocks per minute, tenant and template, of the first blocks two requests or more sent in the
# hour (the window sum below); whole hours are emptied and summed again, as that count is the hour's.
# The latest request of a group is the last by (arrived_at, server, request id): one rule everywhere.
_LATEST = "ORDER BY {at} DESC, {server} DESC, {request} DESC"
_LATEST_RECORD = _LATEST.format(at="arrived_at", server="server_id", request="request_id")
_LATEST_ROW = _LATEST.format(at="last_seen_at", server="last_server_id", request="last_request_id")
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
_PREFIX_HOUR_DELETE_SQL = (
    "DELETE FROM traffic_unsaltedprefixhour WHERE hour >= %(since)s AND hour < %(until)s"
)
PREFIX_HOUR_SQL = f"""
INSERT INTO traffic_unsaltedprefixhour (hour, {_PREFIX_COLUMNS})
SELECT date_trunc('hour', minute), model, first_block, tenant, template_id, sum(requests),
       max(last_seen_at), (array_agg(last_server_id {_LATEST_ROW}))[1],
       (array_agg(last_request_id {_LATEST_ROW}))[1]
FROM traffic_unsaltedprefixminute WHERE minute >= %(since)s AND minute < %(until)s
GROUP BY 1, 2, 3, 4, 5
"""


def refresh_unsalted_prefixes(*, since: datetime, until: datetime) -> None:
    """Recompute the unsalted prefix minutes and hours of every whole hour touching [since, until)
    from the records (whether a first block counts depends on its whole hour)."""
    hours = dict(zip(("since", "until"), whole_hours(since, until), strict=True))
    with transaction.atomic(), connection.cursor() as cursor:
        for sql in (_PREFIX_MINUTE_DELETE_SQL, PREFIX_MINUTE_SQL, _PREFIX_HOUR_DELETE_SQL, PREFIX_HOUR_SQL):
            cursor.execute(sql, hours)
