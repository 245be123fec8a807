"""Reads behind the Templates list and a template's page: sums of the request and loss rollups per
template over a window (the hourly ones for a window of whole hours), never raw request records.

Every read takes the `viewer` (app/core/tenancy.py): a tenant's user sums only the rows it may see.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, DateTimeField, F, Func, Model, QuerySet, Sum, Value

from app.core.tenancy import SEES_ALL, Viewer
from app.domain.hitrate import RequestSums
from app.domain.prefill import PrefillSums
from app.prompts.models import PrefixFamily
from app.regressions.models import Regression
from app.rollups.sketch_sql import loaded, merged_sketch_sql
from app.rollups.visibility import visible, visible_sql, visible_sums, visible_sums_sql
from app.traffic.models import (
    LOST_COLUMNS,
    HourRollup,
    LossHour,
    LossMinute,
    MinuteRollup,
    TemplateLossHour,
    TemplateRequestHour,
)

_TOTALS = ("requests", "prompt_tokens", "cached_tokens", "cache_known_prompt_tokens")


def _whole_hours(since: datetime, until: datetime) -> bool:
    return all(moment.minute == moment.second == moment.microsecond == 0 for moment in (since, until))


def _requests(since: datetime, until: datetime, viewer: Viewer) -> QuerySet[Any]:
    """The request rollup rows of [since, until): by the hour when both ends are whole hours."""
    if _whole_hours(since, until):
        rows: QuerySet[Any] = HourRollup.objects.filter(hour__gte=since, hour__lt=until)
    else:
        rows = MinuteRollup.objects.filter(minute__gte=since, minute__lt=until)
    return visible(viewer, rows)


def _losses(since: datetime, until: datetime, viewer: Viewer) -> QuerySet[Any]:
    if _whole_hours(since, until):
        rows: QuerySet[Any] = LossHour.objects.filter(hour__gte=since, hour__lt=until)
    else:
        rows = LossMinute.objects.filter(minute__gte=since, minute__lt=until)
    return visible(viewer, rows)


def _seen_sql(viewer: Viewer, model: type[Model]) -> tuple[str, dict[str, Any]]:
    """visibility.visible_sql of a sum table, as a condition and its parameters."""
    found = visible_sql(viewer, model)
    return found.sql, found.params


def _template_rows(since: datetime, until: datetime, viewer: Viewer, *, losses: bool) -> list[QuerySet[Any]]:
    """The request (or loss) rollup rows of some template in [since, until) the viewer sees, as
    querysets to sum apart: for whole hours, the sums per template where the viewer may read them and
    the rest from the hour rollups (visibility.visible_sums); else the
    minute rollups."""
    if not _whole_hours(since, until):
        rows = _losses(since, until, viewer) if losses else _requests(since, until, viewer)
        return [rows.filter(template__isnull=False)]
    window = {"hour__gte": since, "hour__lt": until}
    if losses:
        sums = TemplateLossHour.objects.filter(**window)
        return visible_sums(viewer, sums, LossHour.objects.filter(**window))
    per_template = TemplateRequestHour.objects.filter(**window)
    return visible_sums(viewer, per_template, HourRollup.objects.filter(**window))


def _hour_rows(select: str, where: str, viewer: Viewer, *, losses: bool) -> tuple[str, dict[str, Any]]:
    """SQL of the hour rollups' rows of some template the viewer sees, `select` of those matching
    `where`, as _template_rows' querysets: the per-template sums where the viewer may read them, the
    rest from the per-server hour rollup (a UNION ALL; both tables have the columns summed)."""
    summed, finer = (TemplateLossHour, LossHour) if losses else (TemplateRequestHour, HourRollup)
    sums, fine = visible_sums_sql(viewer, summed, finer)
    parts = [f"SELECT {select} FROM {summed._meta.db_table} WHERE {sums.sql} AND {where}"]
    if fine.sql != "false":
        parts.append(f"SELECT {select} FROM {finer._meta.db_table} WHERE {fine.sql} AND {where}")
    return " UNION ALL ".join(parts), {**sums.params, **fine.params}


def totals_by_template(
    *, since: datetime, until: datetime, viewer: Viewer = SEES_ALL, template_id: int | None = None
) -> dict[int, RequestSums]:
    """Each template's totals over [since, until) (templates without requests left out)."""
    found: dict[int, RequestSums] = {}
    for rows in _template_rows(since, until, viewer, losses=False):
        if template_id is not None:
            rows = rows.filter(template_id=template_id)
        summed: Iterable[dict[str, Any]] = rows.values("template_id").annotate(
            **{name: Sum(name) for name in _TOTALS}
        )
        for row in summed:
            before = found.get(row["template_id"], RequestSums())
            found[row["template_id"]] = RequestSums(
                *(getattr(before, name) + (row[name] or 0) for name in _TOTALS)
            )
    return found


def totals_by_server(
    *, template_id: int, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> dict[int, RequestSums]:
    """One template's totals over [since, until) per server that served it."""
    rows = _requests(since, until, viewer).filter(template_id=template_id)
    summed: Iterable[dict[str, Any]] = rows.values("server_id").annotate(
        **{name: Sum(name) for name in _TOTALS}
    )
    return {row["server_id"]: RequestSums(**{name: row[name] or 0 for name in _TOTALS}) for row in summed}


def template_totals(
    *, template_id: int, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> RequestSums:
    return totals_by_template(since=since, until=until, viewer=viewer, template_id=template_id).get(
        template_id, RequestSums()
    )


def hit_rate_trends(
    *, since: datetime, until: datetime, bucket: int, viewer: Viewer = SEES_ALL
) -> dict[int, list[float | None]]:
    """Each template's delivered hit rate per `bucket` seconds of [since, until) (None where no request
    reported its cached tokens): the Templates list's sparklines. Of the hour rollups when both ends are
    whole hours (their sums per template where the viewer may read them: one query, or two for a
    tenant), else the minute rollups; buckets start on multiples of `bucket` from midnight."""
    column = "hour" if _whole_hours(since, until) else "minute"
    start = Func(Value(timedelta(seconds=bucket)), F(column), Value(_ORIGIN), function="date_bin",
                 output_field=DateTimeField())  # fmt: skip
    count = int((until - since).total_seconds()) // bucket
    sums: dict[tuple[int, int], list[int]] = {}  # (template, bucket index): cached and known tokens
    for rows in _template_rows(since, until, viewer, losses=False):
        summed: Iterable[dict[str, Any]] = (
            rows.annotate(start=start)
            .values("template_id", "start")
            .annotate(cached=Sum("cached_tokens"), known=Sum("cache_known_prompt_tokens"))
        )
        for row in summed:
            index = int((row["start"] - since).total_seconds()) // bucket
            if 0 <= index < count:
                tokens = sums.setdefault((row["template_id"], index), [0, 0])
                tokens[0], tokens[1] = tokens[0] + (row["cached"] or 0), tokens[1] + (row["known"] or 0)
    found: dict[int, list[float | None]] = {}
    for (template_id, index), (cached, known) in sums.items():
        if known:
            found.setdefault(template_id, [None] * count)[index] = cached / known
    return found


_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # as app/rollups/series.py bins: a day's bucket starts at 0:00 UTC


def lost_by_template(
    *, since: datetime, until: datetime, viewer: Viewer = SEES_ALL, template_id: int | None = None
) -> dict[int, dict[str, int]]:
    """Each template's prompt tokens lost per miss cause over [since, until), from the loss rollups."""
    found: dict[int, dict[str, int]] = {}
    for rows in _template_rows(since, until, viewer, losses=True):
        if template_id is not None:
            rows = rows.filter(template_id=template_id)
        summed: Iterable[dict[str, Any]] = rows.values("template_id").annotate(
            **{cause: Sum(column) for cause, column in LOST_COLUMNS.items()}
        )
        for row in summed:
            lost = found.setdefault(row["template_id"], dict.fromkeys(LOST_COLUMNS, 0))
            for cause in LOST_COLUMNS:
                lost[cause] += row[cause] or 0
    return found


def open_regressions_by_template(*, viewer: Viewer = SEES_ALL) -> dict[int, int]:
    """How many regressions of each template are open or acknowledged (neither resolved nor muted);
    a regression of the template on one server counts where that server is visible."""
    found = Regression.objects.filter(
        template__isnull=False, state__in=(Regression.State.OPEN, Regression.State.ACKNOWLEDGED)
    )
    found = viewer.regressions(found)
    counted = found.values("template_id").annotate(open=Count("id"))
    return {row["template_id"]: row["open"] for row in counted}


def regressions_of(template_id: int, *, viewer: Viewer = SEES_ALL, limit: int = 20) -> QuerySet[Regression]:
    """The template's regressions (on any of its scopes), unresolved first, then newest change first."""
    found = Regression.objects.filter(template_id=template_id).select_related("server", "suspect_version")
    found = viewer.regressions(found)
    return found.order_by("resolved_at", "-changed_at")[:limit]


def families_of(template_id: int, *, viewer: Viewer = SEES_ALL) -> QuerySet[PrefixFamily]:
    """The prefix families bound to the template, most requests first."""
    return viewer.families(PrefixFamily.objects.filter(template_id=template_id)).select_related(
        "sample_server"
    )


@dataclass(frozen=True, slots=True)
class BucketSums:
    """A template's request rollups summed over one bucket of a window: what its charts draw."""

    requests: int
    cached_tokens: int
    cache_known_prompt_tokens: int
    ttft_sketch: dict[str, int]  # the merged TTFT quantile sketch (of the TTFT asked for)


@dataclass(frozen=True, slots=True)
class TemplateRequests:
    """A template's request rollups over a window, read once: per bucket (the charts), per server
    (the KV memory its prefix holds) and in all (its totals and prefill sums)."""

    buckets: dict[datetime, BucketSums]
    servers: dict[int, RequestSums]
    totals: RequestSums
    prefill: PrefillSums


_PREFILL = ("prefill_count", "prefill_uncached_sum", "prefill_ttft_sum", "prefill_uncached_squares",
            "prefill_cross_sum")  # fmt: skip


def template_requests(
    *, template_id: int, since: datetime, until: datetime, bucket: int, ttft: str, viewer: Viewer = SEES_ALL
) -> TemplateRequests:
    """One read of the template's request rollups over [since, until), grouped at once by bucket and
    in all (GROUPING SETS), and its totals per server: for buckets of whole hours, as the series API
    reads a template (app/rollups/series.py), the buckets from its sums per template where the viewer
    may read them (_hour_rows) and the servers from the hour rollups' index of the template's totals
    (hour_rollup_template_sums, an index-only scan); the minute rollups otherwise, in one query. The
    buckets' TTFT sketches are merged by a second query over the same rows."""
    hours = bucket % 3600 == 0
    time = "hour" if hours else "minute"
    sums = ", ".join(f"coalesce(sum({name}), 0)" for name in (*_TOTALS, *_PREFILL))
    columns = f"{_BIN.format(time)} AS b, {', '.join((*_TOTALS, *_PREFILL))}, {ttft}_ttft_sketch"
    where = f"template_id = %(id)s AND {time} >= %(since)s AND {time} < %(until)s"
    if hours:
        rows, params = _hour_rows(columns, where, viewer, losses=False)
        (grouped, server), sets = ("1", "NULL"), "(b), ()"  # 1: as grouping() of a set without it
    else:
        seen, params = _seen_sql(viewer, MinuteRollup)
        rows = f"SELECT server_id, {columns} FROM traffic_minuterollup WHERE {seen} AND {where}"
        (grouped, server), sets = ("grouping(server_id)", "server_id"), "(b), (server_id), ()"
    sql = f"""
        SELECT grouping(b), {grouped}, b, {server}, {sums} FROM ({rows}) AS rows
        GROUP BY GROUPING SETS ({sets})
    """
    asked = {**params, "id": template_id, "since": since, "until": until, "bucket": bucket}
    with connection.cursor() as cursor:
        cursor.execute(sql, asked)
        grouped_rows = cursor.fetchall()
        cursor.execute(merged_sketch_sql(rows=rows, by="b", sketch=f"{ttft}_ttft_sketch"), asked)
        found = _request_sums(grouped_rows, {start: loaded(sketch) for start, sketch in cursor.fetchall()})
    if hours:
        found.servers.update(_server_hours(template_id, since, until, viewer))
    return found


def _request_sums(rows: Iterable[Any], sketches: dict[datetime, dict[str, int]]) -> TemplateRequests:
    """template_requests' rows: per bucket, per server and in all, told apart by grouping(); each
    bucket with its merged TTFT sketch from `sketches` (none: empty)."""
    buckets: dict[datetime, BucketSums] = {}
    servers: dict[int, RequestSums] = {}
    totals, prefill = RequestSums(), PrefillSums()
    width = len(_TOTALS)
    for no_bucket, no_server, start, server_id, *values in rows:
        counted = RequestSums(*(int(v) for v in values[:width]))
        if not no_bucket:
            sketch = sketches.get(start, {})
            buckets[start] = BucketSums(counted.requests, counted.cached_tokens,
                                        counted.cache_known_prompt_tokens, sketch)  # fmt: skip
        elif not no_server:
            servers[server_id] = counted
        else:
            totals = counted
            count, *floats = values[width : width + len(_PREFILL)]
            prefill = PrefillSums(int(count), *(float(f) for f in floats))
    return TemplateRequests(buckets, servers, totals, prefill)


def _server_hours(
    template_id: int, since: datetime, until: datetime, viewer: Viewer
) -> dict[int, RequestSums]:
    """The template's totals per server over [since, until) of whole hours, from the hour rollups the
    viewer sees: the index of the template's hours holds the server and these totals."""
    seen, params = _seen_sql(viewer, HourRollup)
    sums = ", ".join(f"coalesce(sum({name}), 0)" for name in _TOTALS)
    sql = f"""
        SELECT server_id, {sums} FROM traffic_hourrollup
        WHERE template_id = %(id)s AND {seen} AND hour >= %(since)s AND hour < %(until)s GROUP BY server_id
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, "id": template_id, "since": since, "until": until})
        return {server_id: RequestSums(*(int(v) for v in values)) for server_id, *values in cursor.fetchall()}


_BIN = "date_bin(make_interval(secs => %(bucket)s), {}, TIMESTAMPTZ '2000-01-01')"


def template_losses(
    *, template_id: int, since: datetime, until: datetime, bucket: int, viewer: Viewer = SEES_ALL
) -> dict[datetime | None, dict[str, int]]:
    """One read of the template's loss rollups over [since, until): the prompt tokens lost per miss
    cause per bucket, and (at None) in all; for buckets of whole hours, of its sums per template and
    tenant where the viewer may read them and the hour rollups (_hour_rows), else the minutes."""
    hours = bucket % 3600 == 0
    time = "hour" if hours else "minute"
    causes = list(LOST_COLUMNS)
    columns = f"{_BIN.format(time)} AS b, {', '.join(LOST_COLUMNS[c] for c in causes)}"
    where = f"template_id = %(id)s AND {time} >= %(since)s AND {time} < %(until)s"
    if hours:
        rows, params = _hour_rows(columns, where, viewer, losses=True)
    else:
        seen, params = _seen_sql(viewer, LossMinute)
        rows = f"SELECT {columns} FROM traffic_lossminute WHERE {seen} AND {where}"
    sums = ", ".join(f"coalesce(sum({LOST_COLUMNS[c]}), 0)" for c in causes)
    sql = f"SELECT b, {sums} FROM ({rows}) AS rows GROUP BY GROUPING SETS ((b), ())"
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, "id": template_id, "since": since, "until": until, "bucket": bucket})
        found = cursor.fetchall()
    return {start: dict(zip(causes, (int(v) for v in values), strict=True)) for start, *values in found}


@dataclass(frozen=True, slots=True)
class ListSums:
    """What the Templates list reads of the request rollups, per template: its totals over the window
    and over the one of the same length just before it, and its hit rate per bucket of the window."""

    now: dict[int, RequestSums]
    before: dict[int, RequestSums]
    trends: dict[int, list[float | None]]  # as hit_rate_trends


def list_sums(*, since: datetime, until: datetime, bucket: int, viewer: Viewer = SEES_ALL) -> ListSums:
    """One read of the request rollups over both windows (for whole hours, of the sums per template
    where the viewer may read them and the hour rollups: _hour_rows), grouped by template and, for the
    window's rows, by bucket too (GROUPING SETS): the same sums as totals_by_template over each window
    and hit_rate_trends, in one pass over the rows."""
    before = since - (until - since)
    time = "hour" if _whole_hours(since, until) else "minute"
    columns = f"template_id, {time} AS t, {', '.join(_TOTALS)}"
    where = f"{time} >= %(before)s AND {time} < %(until)s"
    if time == "hour":
        rows, params = _hour_rows(columns, where, viewer, losses=False)
    else:
        seen, params = _seen_sql(viewer, MinuteRollup)
        rows = (
            f"SELECT {columns} FROM traffic_minuterollup WHERE template_id IS NOT NULL AND {seen} AND {where}"
        )
    now_sums = ", ".join(f"coalesce(sum({name}) FILTER (WHERE t >= %(since)s), 0)" for name in _TOTALS)
    before_sums = ", ".join(f"coalesce(sum({name}) FILTER (WHERE t < %(since)s), 0)" for name in _TOTALS)
    sql = f"""
        SELECT grouping(b), template_id, b, {now_sums}, {before_sums}
        FROM (SELECT CASE WHEN t >= %(since)s THEN {_BIN.format("t")} END AS b, * FROM ({rows}) AS r) AS rows
        GROUP BY GROUPING SETS ((template_id, b), (template_id))
    """
    window: dict[str, Any] = {"since": since, "until": until, "before": before, "bucket": bucket}
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, **window})
        rows = cursor.fetchall()
    width, count = len(_TOTALS), int((until - since).total_seconds()) // bucket
    found = ListSums({}, {}, {})
    for per_template, template_id, start, *sums in rows:
        now = RequestSums(*(int(v) for v in sums[:width]))
        if per_template:  # zeros for a template of no row in one window, as a template absent there
            found.now[template_id] = now
            found.before[template_id] = RequestSums(*(int(v) for v in sums[width:]))
        elif start is not None and now.cache_known_prompt_tokens:
            index = int((start - since).total_seconds()) // bucket
            if 0 <= index < count:
                trend = found.trends.setdefault(template_id, [None] * count)
                trend[index] = now.cached_tokens / now.cache_known_prompt_tokens
    return found


def gateway_cache_answers(
    *, template_id: int, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> int:
    """Requests of the template a gateway answered from its semantic cache in [since, until), of what
    the viewer sees (the loss rollups' gateway_cache_hits)."""
    return sum(
        rows.filter(template_id=template_id).aggregate(n=Sum("gateway_cache_hits"))["n"] or 0
        for rows in _template_rows(since, until, viewer, losses=True)
    )
