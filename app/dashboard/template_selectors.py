"""Reads behind the Templates list and a template's page: sums of the request and loss rollups per
template over a window (the hourly ones for a window of whole hours), never raw request records.

Every read takes the `viewer` (app/core/tenancy.py): a tenant's user sums only the rows it may see.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, DateTimeField, F, Func, Min, Q, QuerySet, Sum, Value

from app.core.tenancy import SEES_ALL, Viewer
from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.domain.prefill import PrefillSums
from app.prompts.models import PrefixFamily, TemplateVersion
from app.regressions.models import Regression
from app.traffic.models import HourRollup, LossHour, LossMinute, MinuteRollup
from app.traffic.selectors import LOST_COLUMNS


@dataclass(frozen=True, slots=True)
class Totals:
    """A template's request rollups summed over a window (of some servers)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_known_prompt_tokens: int = 0  # prompt tokens of the requests that reported cached tokens

    @property
    def hit_rate(self) -> float | None:
        """Delivered hit rate, weighted by tokens; None when no request reported its cached tokens."""
        known = self.cache_known_prompt_tokens
        return self.cached_tokens / known if known else None


_TOTALS = ("requests", "prompt_tokens", "cached_tokens", "cache_known_prompt_tokens")


def _whole_hours(since: datetime, until: datetime) -> bool:
    return all(moment.minute == moment.second == moment.microsecond == 0 for moment in (since, until))


def _requests(since: datetime, until: datetime, viewer: Viewer) -> QuerySet[Any]:
    """The request rollup rows of [since, until): by the hour when both ends are whole hours."""
    if _whole_hours(since, until):
        rows: QuerySet[Any] = HourRollup.objects.filter(hour__gte=since, hour__lt=until)
    else:
        rows = MinuteRollup.objects.filter(minute__gte=since, minute__lt=until)
    return viewer.rollups(rows)


def _losses(since: datetime, until: datetime, viewer: Viewer) -> QuerySet[Any]:
    if _whole_hours(since, until):
        rows: QuerySet[Any] = LossHour.objects.filter(hour__gte=since, hour__lt=until)
    else:
        rows = LossMinute.objects.filter(minute__gte=since, minute__lt=until)
    return viewer.traffic(rows)


def totals_by_template(
    *, since: datetime, until: datetime, viewer: Viewer = SEES_ALL, template_id: int | None = None
) -> dict[int, Totals]:
    """Each template's totals over [since, until) (templates without requests left out)."""
    rows = _requests(since, until, viewer).filter(template__isnull=False)
    if template_id is not None:
        rows = rows.filter(template_id=template_id)
    summed: Iterable[dict[str, Any]] = rows.values("template_id").annotate(
        **{name: Sum(name) for name in _TOTALS}
    )
    return {row["template_id"]: Totals(**{name: row[name] or 0 for name in _TOTALS}) for row in summed}


def totals_by_server(
    *, template_id: int, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> dict[int, Totals]:
    """One template's totals over [since, until) per server that served it."""
    rows = _requests(since, until, viewer).filter(template_id=template_id)
    summed: Iterable[dict[str, Any]] = rows.values("server_id").annotate(
        **{name: Sum(name) for name in _TOTALS}
    )
    return {row["server_id"]: Totals(**{name: row[name] or 0 for name in _TOTALS}) for row in summed}


def template_totals(
    *, template_id: int, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> Totals:
    return totals_by_template(since=since, until=until, viewer=viewer, template_id=template_id).get(
        template_id, Totals()
    )


def hit_rate_trends(
    *, since: datetime, until: datetime, bucket: int, viewer: Viewer = SEES_ALL
) -> dict[int, list[float | None]]:
    """Each template's delivered hit rate per `bucket` seconds of [since, until) (None where no request
    reported its cached tokens): the Templates list's sparklines. One query for every template, of the
    hour rollups when both ends are whole hours; buckets start on multiples of `bucket` from midnight."""
    rows = _requests(since, until, viewer).filter(template__isnull=False)
    column = "hour" if _whole_hours(since, until) else "minute"
    start = Func(Value(timedelta(seconds=bucket)), F(column), Value(_ORIGIN), function="date_bin",
                 output_field=DateTimeField())  # fmt: skip
    summed: Iterable[dict[str, Any]] = (
        rows.annotate(start=start)
        .values("template_id", "start")
        .annotate(cached=Sum("cached_tokens"), known=Sum("cache_known_prompt_tokens"))
    )
    count = int((until - since).total_seconds()) // bucket
    found: dict[int, list[float | None]] = {}
    for row in summed:
        index = int((row["start"] - since).total_seconds()) // bucket
        if 0 <= index < count and row["known"]:
            found.setdefault(row["template_id"], [None] * count)[index] = row["cached"] / row["known"]
    return found


_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # as app/traffic/series.py bins: a day's bucket starts at 0:00 UTC


def lost_by_template(
    *, since: datetime, until: datetime, viewer: Viewer = SEES_ALL, template_id: int | None = None
) -> dict[int, dict[str, int]]:
    """Each template's prompt tokens lost per miss cause over [since, until), from the loss rollups."""
    rows = _losses(since, until, viewer).filter(template__isnull=False)
    if template_id is not None:
        rows = rows.filter(template_id=template_id)
    summed: Iterable[dict[str, Any]] = rows.values("template_id").annotate(
        **{cause: Sum(column) for cause, column in LOST_COLUMNS.items()}
    )
    return {row["template_id"]: {cause: row[cause] or 0 for cause in LOST_COLUMNS} for row in summed}


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


def prefill_sums(
    *, template_id: int, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> PrefillSums:
    """The TTFT-over-uncached-tokens sums of the template's requests (app/domain/prefill.py)."""
    found = (
        _requests(since, until, viewer)
        .filter(template_id=template_id)
        .aggregate(
            count=Sum("prefill_count"), x=Sum("prefill_uncached_sum"), y=Sum("prefill_ttft_sum"),
            xx=Sum("prefill_uncached_squares"), xy=Sum("prefill_cross_sum"),
        )
    )  # fmt: skip
    return PrefillSums(**{name: value or 0 for name, value in found.items()})


@dataclass(frozen=True, slots=True)
class LiveVersion:
    """A version of a template and when it went live: its first deploy marker, else the first request
    that named it; None when neither is known (committed, never seen serving)."""

    version: TemplateVersion
    live_at: datetime | None
    source: str  # "deploy", "first request" or ""


def live_versions(template_id: int) -> list[LiveVersion]:
    """The template's versions, the latest live first (those never live last, newest commit first)."""
    versions = TemplateVersion.objects.filter(template_id=template_id).annotate(
        deployed=Min("deploys__deployed_at", filter=Q(deploys__source="api"))
    )
    found = []
    for version in versions.defer("content"):
        if version.deployed is not None:
            found.append(LiveVersion(version, version.deployed, "deploy"))
        else:
            source = "first request" if version.first_seen_at else ""
            found.append(LiveVersion(version, version.first_seen_at, source))
    never = [v for v in found if v.live_at is None]
    live = sorted((v for v in found if v.live_at is not None), key=lambda v: v.live_at, reverse=True)  # type: ignore[arg-type, return-value]
    return live + never


@dataclass(frozen=True, slots=True)
class Effect:
    """A version's effect: the template's totals over equal windows just before and after it went live."""

    minutes: int  # of each window; shorter than asked when the version went live less than that ago
    before: Totals
    after: Totals

    @property
    def change(self) -> float | None:
        if self.before.hit_rate is None or self.after.hit_rate is None:
            return None
        return self.after.hit_rate - self.before.hit_rate


def version_effect(
    *, template_id: int, live_at: datetime, now: datetime, minutes: int = 60, viewer: Viewer = SEES_ALL
) -> Effect:
    """The template's hit rate in the `minutes` after `live_at` (to now at most) and in as many before it,
    in whole minutes: the minute it went live counts as after."""
    start = live_at.replace(second=0, microsecond=0)
    end = min(start + timedelta(minutes=minutes), now.replace(second=0, microsecond=0))
    span = max(end - start, timedelta(minutes=1))
    after = template_totals(template_id=template_id, since=start, until=start + span, viewer=viewer)
    before = template_totals(template_id=template_id, since=start - span, until=start, viewer=viewer)
    return Effect(int(span.total_seconds() // 60), before, after)


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
    ttft_counts: list[int]  # the summed cumulative TTFT histogram (of the TTFT asked for)


@dataclass(frozen=True, slots=True)
class TemplateRequests:
    """A template's request rollups over a window, read once: per bucket (the charts), per server
    (the KV memory its prefix holds) and in all (its totals and prefill sums)."""

    buckets: dict[datetime, BucketSums]
    servers: dict[int, Totals]
    totals: Totals
    prefill: PrefillSums


_PREFILL = ("prefill_count", "prefill_uncached_sum", "prefill_ttft_sum", "prefill_uncached_squares",
            "prefill_cross_sum")  # fmt: skip


def template_requests(
    *, template_id: int, since: datetime, until: datetime, bucket: int, ttft: str, viewer: Viewer = SEES_ALL
) -> TemplateRequests:
    """One read of the template's request rollups over [since, until), grouped at once by bucket, by
    server and in all (GROUPING SETS): of the hour rollups for buckets of whole hours, as the series
    API reads a template (app/traffic/series.py), the minute rollups otherwise."""
    table, time = ("traffic_hourrollup", "hour") if bucket % 3600 == 0 else ("traffic_minuterollup", "minute")
    seen, params = viewer.rollups_sql()
    histogram = ", ".join(
        f"coalesce(sum({ttft}_ttft_buckets[{i}]), 0)" for i in range(1, len(TTFT_BUCKETS_SECONDS) + 2)
    )
    sums = ", ".join(f"coalesce(sum({name}), 0)" for name in (*_TOTALS, *_PREFILL))
    sql = f"""
        SELECT grouping(b), grouping(server_id), b, server_id, {sums}, {histogram}
        FROM (SELECT {_BIN.format(time)} AS b, * FROM {table}
              WHERE template_id = %(id)s AND {seen} AND {time} >= %(since)s AND {time} < %(until)s) AS rows
        GROUP BY GROUPING SETS ((b), (server_id), ())
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, "id": template_id, "since": since, "until": until, "bucket": bucket})
        rows = cursor.fetchall()
    buckets: dict[datetime, BucketSums] = {}
    servers: dict[int, Totals] = {}
    totals, prefill = Totals(), PrefillSums()
    width = len(_TOTALS)
    for no_bucket, no_server, start, server_id, *values in rows:
        counted = Totals(*(int(v) for v in values[:width]))
        if not no_bucket:
            ttft_counts = [int(n) for n in values[width + len(_PREFILL) :]]
            buckets[start] = BucketSums(counted.requests, counted.cached_tokens,
                                        counted.cache_known_prompt_tokens, ttft_counts)  # fmt: skip
        elif not no_server:
            servers[server_id] = counted
        else:
            totals = counted
            count, *floats = values[width : width + len(_PREFILL)]
            prefill = PrefillSums(int(count), *(float(f) for f in floats))
    return TemplateRequests(buckets, servers, totals, prefill)


_BIN = "date_bin(make_interval(secs => %(bucket)s), {}, TIMESTAMPTZ '2000-01-01')"


def template_losses(
    *, template_id: int, since: datetime, until: datetime, bucket: int, viewer: Viewer = SEES_ALL
) -> dict[datetime | None, dict[str, int]]:
    """One read of the template's loss rollups over [since, until): the prompt tokens lost per miss
    cause per bucket, and (at None) in all; of the hour rollups for buckets of whole hours."""
    table, time = ("traffic_losshour", "hour") if bucket % 3600 == 0 else ("traffic_lossminute", "minute")
    seen, params = viewer.traffic_sql()
    causes = list(LOST_COLUMNS)
    sums = ", ".join(f"coalesce(sum({LOST_COLUMNS[c]}), 0)" for c in causes)
    sql = f"""
        SELECT b, {sums}
        FROM (SELECT {_BIN.format(time)} AS b, * FROM {table}
              WHERE template_id = %(id)s AND {seen} AND {time} >= %(since)s AND {time} < %(until)s) AS rows
        GROUP BY GROUPING SETS ((b), ())
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, "id": template_id, "since": since, "until": until, "bucket": bucket})
        rows = cursor.fetchall()
    return {start: dict(zip(causes, (int(v) for v in values), strict=True)) for start, *values in rows}


@dataclass(frozen=True, slots=True)
class ListSums:
    """What the Templates list reads of the request rollups, per template: its totals over the window
    and over the one of the same length just before it, and its hit rate per bucket of the window."""

    now: dict[int, Totals]
    before: dict[int, Totals]
    trends: dict[int, list[float | None]]  # as hit_rate_trends


def list_sums(*, since: datetime, until: datetime, bucket: int, viewer: Viewer = SEES_ALL) -> ListSums:
    """One read of the request rollups over both windows (of the hour rollups when both ends are whole
    hours), grouped by template and, for the window's rows, by bucket too (GROUPING SETS): the same
    sums as totals_by_template over each window and hit_rate_trends, in one pass over the rows."""
    before = since - (until - since)
    table, time = (
        ("traffic_hourrollup", "hour") if _whole_hours(since, until) else ("traffic_minuterollup", "minute")
    )
    seen, params = viewer.rollups_sql()
    now_sums = ", ".join(f"coalesce(sum({name}) FILTER (WHERE {time} >= %(since)s), 0)" for name in _TOTALS)
    before_sums = ", ".join(f"coalesce(sum({name}) FILTER (WHERE {time} < %(since)s), 0)" for name in _TOTALS)
    sql = f"""
        SELECT grouping(b), template_id, b, {now_sums}, {before_sums}
        FROM (SELECT CASE WHEN {time} >= %(since)s THEN {_BIN.format(time)} END AS b, * FROM {table}
              WHERE template_id IS NOT NULL AND {seen}
                AND {time} >= %(before)s AND {time} < %(until)s) AS rows
        GROUP BY GROUPING SETS ((template_id, b), (template_id))
    """
    window: dict[str, Any] = {"since": since, "until": until, "before": before, "bucket": bucket}
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, **window})
        rows = cursor.fetchall()
    width, count = len(_TOTALS), int((until - since).total_seconds()) // bucket
    found = ListSums({}, {}, {})
    for per_template, template_id, start, *sums in rows:
        now = Totals(*(int(v) for v in sums[:width]))
        if per_template:  # zeros for a template of no row in one window, as a template absent there
            found.now[template_id] = now
            found.before[template_id] = Totals(*(int(v) for v in sums[width:]))
        elif start is not None and now.cache_known_prompt_tokens:
            index = int((start - since).total_seconds()) // bucket
            if 0 <= index < count:
                trend = found.trends.setdefault(template_id, [None] * count)
                trend[index] = now.cached_tokens / now.cache_known_prompt_tokens
    return found
