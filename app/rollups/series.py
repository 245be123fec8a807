"""Time series for charts and the series API, read from the per-minute rollups (never raw request
records) and aggregated into buckets in SQL; and, for one server, from its scrapes and KV events.

What the rollups hold per minute is summed per bucket, and ratios are taken of the sums: a bucket's
hit rate weighs each request by its tokens, a TTFT quantile comes from the bucket's summed histogram.
"""

from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from app.core.tenancy import SEES_ALL, Viewer
from app.domain.misses import is_loss
from app.domain.sketch import sketch_quantile
from app.fleet.models import Server
from app.rollups.catalog import table_rollup
from app.rollups.series_query import (
    BUCKETS,
    MAX_ID,
    MAX_POINTS,
    MAX_WINDOW,
    METRICS,
    ROLLUP_METRICS,
    SCOPES,
    SERVER_METRICS,
    TTFTS,
    UNITS,
    Series,
    SeriesError,
    SeriesQuery,
    SeriesSet,
    as_csv,
    bucket_starts,
    is_key,
    parse_query,
    table_rows,
)
from app.rollups.sketch_sql import loaded, merged_sketch_sql
from app.rollups.visibility import visible_sql, visible_sums_sql
from app.traffic.models import LOST_COLUMNS, KVEvent, RequestDiagnosis
from app.traffic.residency import cached_removal_sql
from collectors.metrics.names import (
    FINISHED_REQUESTS,
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
)

# The query's names stay importable from here, where the pages and the API import them.
__all__ = [
    "BUCKETS",
    "MAX_ID",
    "MAX_POINTS",
    "MAX_WINDOW",
    "METRICS",
    "ROLLUP_METRICS",
    "SCOPES",
    "SERVER_METRICS",
    "TTFTS",
    "UNITS",
    "Series",
    "SeriesError",
    "SeriesQuery",
    "SeriesSet",
    "as_csv",
    "bucket_starts",
    "is_key",
    "parse_query",
    "raw_server_series",
    "series",
    "table_rows",
]

_QUANTILES = {"ttft_p50": 0.5, "ttft_p90": 0.9, "ttft_p99": 0.99}
QUARTER_SECONDS = 900  # the grain of ServerLossQuarter
_LOSS_COLUMNS = ", ".join(
    [
        "tenant",
        "requests",
        "diagnosed_prompt_tokens",
        "reused_tokens",
        *(f"{c.value}_tokens" for c in RequestDiagnosis.Cause),
    ]
)


def _bin(column: str) -> str:
    """The start of the bucket `column` falls in, buckets counted from a fixed origin so that a
    bucket of a day starts at midnight UTC and one of an hour on the hour."""
    return f"date_bin(make_interval(secs => %(bucket)s), {column}, TIMESTAMPTZ '2000-01-01')"


def series(query: SeriesQuery, *, viewer: Viewer = SEES_ALL) -> SeriesSet:
    """The series of a parsed query, one value per bucket of [since, until), of the traffic `viewer`
    sees (a server's own readings: of a server it sees, else SeriesError unknown_server)."""
    if query.metric in SERVER_METRICS:
        server_id = _server_id(query.id, viewer)
        return _server_series(query, server_id)
    table, where, params = _scope(query, viewer)
    if query.metric == "lost_tokens":
        return _lost_tokens(query, table, where, params)
    if query.metric.startswith("ttft_"):
        return _ttft(query, table, where, params)
    if "loss" in _source(table):  # a tenant: only the diagnoses carry one
        columns = {"hit_rate": "sum(reused_tokens)::float8 / nullif(sum(diagnosed_prompt_tokens), 0)",
                   "requests": "sum(requests)"}  # fmt: skip
    else:
        columns = {"hit_rate": "sum(cached_tokens)::float8 / nullif(sum(cache_known_prompt_tokens), 0)",
                   "requests": "sum(requests)"}  # fmt: skip
    rows = _bucketed(table, columns[query.metric], where, params, query)
    empty = 0.0 if query.metric == "requests" else None
    values = _on_grid(query, {at: row[0] for at, row in rows.items()}, empty)
    return _set(query, table, [Series(query.metric, values)])


def _scope(query: SeriesQuery, viewer: Viewer) -> tuple[str, str, dict[str, Any]]:
    """The rollup table a query reads and its WHERE clause: request rollups (by the hour for buckets
    of whole hours), or for a tenant (and for lost tokens, which only the diagnoses have) the loss
    rollups; of the rows the viewer sees."""
    hours = query.bucket % 3600 == 0  # a week of whole hours is 168 rows per group, not 10,080
    summed = _summed_table(query, hours=hours)
    if summed:  # the fleet's or a tenant's: from the sums per server (and tenant)
        table, seen, params = _per_server(summed, viewer)
        if query.scope == "tenant":
            return table, f"tenant = %(id)s AND {seen}", {"id": query.id, **params}
        return table, seen, params
    if query.scope == "tenant" or query.metric == "lost_tokens":
        table = "traffic_losshour" if hours else "traffic_lossminute"
    else:
        table = "traffic_hourrollup" if hours else "traffic_minuterollup"
    seen, params = _visible(viewer, table)
    if query.scope == "server":
        return table, f"server_id = %(id)s AND {seen}", {"id": _server_id(query.id, viewer), **params}
    if query.scope == "template":
        return table, f"template_id = %(id)s AND {seen}", {"id": int(query.id), **params}
    if query.scope == "tenant":
        return table, f"tenant = %(id)s AND {seen}", {"id": query.id, **params}
    return table, seen, params


def _visible(viewer: Viewer, table: str) -> tuple[str, dict[str, Any]]:
    found = visible_sql(viewer, table_rollup(table).model)
    return found.sql, found.params


def _summed_table(query: SeriesQuery, *, hours: bool) -> str:
    """The rollup summed per server a fleet's or a tenant's series reads, "" for none: the request
    hours, the loss hours, or for buckets of quarter hours the loss quarters."""
    if query.scope not in ("fleet", "tenant"):
        return ""
    if query.scope == "tenant" or query.metric == "lost_tokens":
        quarters = query.bucket % QUARTER_SECONDS == 0
        return "traffic_serverlosshour" if hours else "traffic_serverlossquarter" if quarters else ""
    return FLEET_HOURS if hours else ""


FLEET_HOURS = "traffic_serverrequesthour"
# A rollup summed per server (and tenant) and the per-template rollup it sums: the tables, their time
# column and the columns a series of them reads.
_PER_SERVER = {
    FLEET_HOURS: ("traffic_hourrollup", "hour", "requests, cached_tokens, cache_known_prompt_tokens, "
                                                "client_ttft_sketch, server_ttft_sketch"),
    "traffic_serverlosshour": ("traffic_losshour", "hour", _LOSS_COLUMNS),
    "traffic_serverlossquarter": ("traffic_lossminute", "minute", _LOSS_COLUMNS),
}  # fmt: skip


def _per_server(table: str, viewer: Viewer) -> tuple[str, str, dict[str, Any]]:
    """A rollup summed per server (a week of a fleet is servers x 168 rows, not x templates too), of
    the rows the viewer sees (visibility.visible_sums_sql): for a viewer of some tenants,
    its servers' sums and, from the per-template rollup, its templates' rows on other servers, as one
    table named as the sums."""
    fine, time, columns = _PER_SERVER[table]
    per_server, per_template = visible_sums_sql(viewer, table_rollup(table).model, table_rollup(fine).model)
    params = {**per_server.params, **per_template.params}
    if per_template.sql == "false":  # an admin's: the sums alone
        return table, per_server.sql, params
    union = (f"(SELECT {time}, {columns} FROM {table} WHERE {per_server.sql} UNION ALL "
             f"SELECT {time}, {columns} FROM {fine} WHERE {per_template.sql}) AS {table}")  # fmt: skip
    return union, "true", params


def _source(table: str) -> str:
    """The table a series is read from, as the answer names it (a union: by its alias)."""
    return table.rsplit(" AS ", 1)[-1]


def _server_id(ident: str, viewer: Viewer) -> int:
    """A server's primary key from its id or its name; SeriesError when there is none the viewer sees."""
    found = viewer.servers(Server.objects.all()).filter(
        **({"pk": int(ident)} if is_key(ident) else {"name": ident})
    )
    pk = found.values_list("pk", flat=True).first()
    if pk is None:
        raise SeriesError("unknown_server", f"no server {ident!r}")
    return pk


def _bucketed(
    table: str,
    columns: str,
    where: str,
    params: dict[str, Any],
    query: SeriesQuery,
    *,
    time: str = "minute",
    sketch: bool = False,
) -> dict[datetime, tuple[Any, ...]]:
    """Rows of `table` summed per bucket: {bucket start: (columns...)}; with `sketch`, `columns` is
    one sketch column, merged index by index (buckets without an entry left out)."""
    hourly = (
        "traffic_hourrollup",
        "traffic_losshour",
        "traffic_serverhour",
        FLEET_HOURS,
        "traffic_serverlosshour",
    )
    time = "hour" if _source(table) in hourly else time
    rows = f"""
        SELECT {_bin(time)} AS b, {columns}
        FROM {table} WHERE {where} AND {time} >= %(since)s AND {time} < %(until)s"""
    sql = merged_sketch_sql(rows=rows, by="b", sketch="sketch") if sketch else f"{rows} GROUP BY b"
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, "bucket": query.bucket, "since": query.since, "until": query.until})
        return {row[0]: tuple(row[1:]) for row in cursor.fetchall()}


def _on_grid(query: SeriesQuery, found: dict[datetime, Any], empty: float | None) -> list[float | None]:
    """One value per bucket: what was found, else `empty` (0 for counts, None for ratios)."""
    values = [found.get(at) for at in bucket_starts(query)]
    return [empty if value is None else float(value) for value in values]


def _set(query: SeriesQuery, source: str, found: list[Series]) -> SeriesSet:
    return SeriesSet(query, UNITS[query.metric], _source(source), bucket_starts(query), found)


def _lost_tokens(query: SeriesQuery, table: str, where: str, params: dict[str, Any]) -> SeriesSet:
    """Prompt tokens lost per cause per bucket; the causes that lost nothing in the window, and what
    no cache could reuse (not a loss: app/domain/misses.py NOT_LOSSES), left out."""
    causes = [cause for cause in LOST_COLUMNS if is_loss(cause)]
    rows = _bucketed(table, ", ".join(f"sum({LOST_COLUMNS[c]})" for c in causes), where, params, query)
    found = []
    for i, cause in enumerate(causes):
        values = _on_grid(query, {at: row[i] for at, row in rows.items()}, 0.0)
        if any(values):
            found.append(Series(cause, values))
    return _set(query, table, found)


def _ttft(query: SeriesQuery, table: str, where: str, params: dict[str, Any]) -> SeriesSet:
    """A TTFT quantile per bucket, from the bucket's merged quantile sketch (app/domain/sketch.py):
    within 0.5 % of the quantile of the records themselves."""
    rows = _bucketed(table, f"{query.ttft}_ttft_sketch AS sketch", where, params, query, sketch=True)
    q = _QUANTILES[query.metric]
    found = {at: sketch_quantile(q, loaded(sketch)) for at, (sketch,) in rows.items()}
    name = f"{query.metric} ({query.ttft})"
    return _set(query, table, [Series(name, _on_grid(query, found, None))])


# A counter's first sample in the window needs the one before it: look back this far for it.
_LOOKBACK = timedelta(minutes=10)

_COUNTER_SQL = f"""
WITH s AS (
    SELECT ss.scraped_at, ss.value, ss.value - lag(ss.value) OVER w AS delta
    FROM traffic_scrapesample ss JOIN traffic_metricseries m ON m.id = ss.series_id
    WHERE ss.server_id = %(server)s AND m.name = ANY(%(names)s)
      AND ss.scraped_at >= %(lookback)s AND ss.scraped_at < %(until)s
    WINDOW w AS (PARTITION BY ss.series_id ORDER BY ss.scraped_at)
)
SELECT {_bin("scraped_at")} AS b, sum(CASE WHEN delta < 0 THEN value ELSE delta END)
FROM s WHERE delta IS NOT NULL AND scraped_at >= %(since)s GROUP BY b
"""
"""How much counters grew per bucket, a reset counting in full (as app.domain.hitrate.counter_increase):
growth between two scrapes falls in the bucket of the later one."""


def _counter_growth(query: SeriesQuery, server_id: int, names: tuple[str, ...]) -> dict[datetime, float]:
    window = {"since": query.since, "until": query.until, "lookback": query.since - _LOOKBACK}
    params: dict[str, Any] = {"server": server_id, "names": list(names), "bucket": query.bucket, **window}
    with connection.cursor() as cursor:
        cursor.execute(_COUNTER_SQL, params)
        return {at: float(grown) for at, grown in cursor.fetchall()}


ROLLED_UP_FROM = 300
"""Buckets of this many seconds or more read a server's readings from its minute (or, for whole
hours, hour) rollups; shorter ones from the raw pulls and events, which have the minute not yet rolled up."""
_ROLLED_UP = {
    "engine_hit_rate": "sum(prefix_hits)::float8 / nullif(sum(prefix_queries), 0)",
    "kv_usage": "sum(kv_usage_sum)::float8 / nullif(sum(kv_usage_samples), 0)",
    "evictions": "sum(evictions)", "preemptions": "sum(preemptions)",
    "request_rate": "sum(finished_requests)::float8 / %(bucket)s",
}  # fmt: skip


def _server_series(query: SeriesQuery, server_id: int) -> SeriesSet:
    """A server's own readings per bucket, from its rollups for long buckets, else from raw rows."""
    if query.bucket < ROLLED_UP_FROM:
        return raw_server_series(query, server_id)
    table = "traffic_serverhour" if query.bucket % 3600 == 0 else "traffic_serverminute"
    rows = _bucketed(table, _ROLLED_UP[query.metric], "server_id = %(id)s", {"id": server_id}, query)
    empty = 0.0 if query.metric == "evictions" else None  # as raw_server_series
    values = _on_grid(query, {at: row[0] for at, row in rows.items()}, empty)
    return _set(query, table, [Series(query.metric, values)])


def raw_server_series(query: SeriesQuery, server_id: int) -> SeriesSet:
    """A server's own readings per bucket: from its scrapes, or (evictions) its KV events."""
    metric = query.metric
    if metric == "engine_hit_rate":
        hits = _counter_growth(query, server_id, PREFIX_CACHE_HITS)
        queries = _counter_growth(query, server_id, PREFIX_CACHE_QUERIES)
        found: dict[datetime, float | None] = {
            at: hits.get(at, 0.0) / q for at, q in queries.items() if q > 0
        }
        return _set(query, "traffic_scrapesample", [Series(metric, _on_grid(query, found, None))])
    if metric in ("preemptions", "request_rate"):
        grown = _counter_growth(
            query, server_id, PREEMPTIONS if metric == "preemptions" else FINISHED_REQUESTS
        )
        per = query.bucket if metric == "request_rate" else 1
        # No pull in a bucket is not zero: nothing is known of it (the server was down, or not yet watched).
        values = _on_grid(query, {at: v / per for at, v in grown.items()}, None)
        return _set(query, "traffic_scrapesample", [Series(metric, values)])
    if metric == "kv_usage":
        where = (
            "server_id = %(id)s AND series_id IN (SELECT id FROM traffic_metricseries WHERE name = %(name)s)"
        )
        params = {"id": server_id, "name": KV_USAGE}
        rows = _bucketed("traffic_scrapesample", "avg(value)", where, params, query, time="scraped_at")
        return _set(
            query,
            "traffic_scrapesample",
            [Series(metric, _on_grid(query, {at: r[0] for at, r in rows.items()}, None))],
        )
    where = f"server_id = %(id)s AND kind = {int(KVEvent.Kind.REMOVED)} AND {cached_removal_sql()}"
    rows = _bucketed("traffic_kvevent", "count(*)", where, {"id": server_id}, query, time="emitted_at")
    return _set(
        query, "traffic_kvevent", [Series(metric, _on_grid(query, {at: r[0] for at, r in rows.items()}, 0.0))]
    )
