"""Sums of a pair of minute and hour rollups over a window: the whole hours from the hours, the
minutes around them from the minutes, of the rows the viewer sees (app/core/tenancy.py)."""

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Aggregate, Q, QuerySet, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.fleet.models import Server
from app.rollups.visibility import visible, visible_sums
from app.traffic.models import (
    HourRollup,
    LossHour,
    LossMinute,
    MinuteRollup,
    ServerHour,
    ServerLossHour,
    ServerLossMinute,
    ServerMinute,
    ServerRequestHour,
    ServerRequestMinute,
)

# The minute and hour rollups of request records, server readings and diagnoses (app/traffic/models/).
REQUEST_ROLLUPS = (MinuteRollup, HourRollup)
SERVER_ROLLUPS = (ServerMinute, ServerHour)
LOSS_ROLLUPS = (LossMinute, LossHour)


def window_sums(
    rollups: tuple[type[Any], type[Any]],
    servers: QuerySet[Server],
    *,
    since: datetime,
    until: datetime,
    sums: Mapping[str, Aggregate],
    by: str = "server_id",
    viewer: Viewer = SEES_ALL,
) -> dict[Any, dict[str, Any]]:
    """Per `by` ("" for one total), `sums` of a pair of minute and hour rollups of `servers` over
    [since, until): the whole hours from the hours, the minutes around them from the minutes (a day
    is 24 rows per server, not 1,440). Aggregates named max_* are the largest of the parts."""
    first, last = _ceil_hour(since), until.replace(minute=0, second=0, microsecond=0)
    ids = servers.values("pk")
    if first < last:
        edges = [(since, first), (last, until)]
        hours = _rows(rollups[1], ids, Q(hour__gte=first, hour__lt=last), by=by, viewer=viewer)
    else:
        edges, hours = [(since, until)], []
    parts = [
        part
        for start, end in edges
        if start < end
        for part in _rows(rollups[0], ids, Q(minute__gte=start, minute__lt=end), by=by, viewer=viewer)
    ]
    found: dict[Any, dict[str, Any]] = {"": dict.fromkeys(sums)} if not by else {}
    for part in parts + hours:
        rows = part.values(by).annotate(**sums) if by else [part.aggregate(**sums)]
        for row in rows:
            total = found.setdefault(row.get(by) if by else "", {})
            for name in sums:
                total[name] = _combined(name, total.get(name), row[name])
    return found  # fmt: skip


# The minute and hour rollups summed per server (and tenant), read instead of them for per-server or
# fleet sums: an hour of a fleet's minutes per template is tens of thousands of rows, per server
# thousands; a week of its hours per template hundreds of thousands, per server thousands.
_PER_SERVER: dict[type[Any], type[Any]] = {
    MinuteRollup: ServerRequestMinute, HourRollup: ServerRequestHour,
    LossMinute: ServerLossMinute, LossHour: ServerLossHour,
}  # fmt: skip


def _rows(rollup: type[Any], ids: Any, within: Q, *, by: str, viewer: Viewer) -> list[QuerySet[Any]]:
    """The rows of a rollup of the servers `ids` (their keys, or a subquery of them) meeting `within`
    (its time range) the viewer sees, as one or more querysets to sum: its per-server sums where they
    hold the same figures (app/rollups/visibility.py)."""
    rows = rollup.objects.filter(within, server__in=ids)
    summed = _PER_SERVER.get(rollup)
    if summed is None or by not in ("", "server_id"):
        return [_seen(rows, viewer)]
    per_server = summed.objects.filter(within, server__in=ids)
    return visible_sums(viewer, per_server, rows)


def _seen(rows: QuerySet[Any], viewer: Viewer) -> QuerySet[Any]:
    """The rows of a rollup the viewer sees (app/rollups/visibility.py)."""
    return visible(viewer, rows)


def _combined(name: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return b if a is None else a
    return max(a, b) if name.startswith("max_") else a + b


def _ceil_hour(moment: datetime) -> datetime:
    floor = moment.replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + timedelta(hours=1)


def windows_totals(
    rollups: tuple[type[Any], type[Any]],
    servers: QuerySet[Server],
    windows: list[tuple[datetime, datetime]],
    *,
    sums: Mapping[str, Sum],
    viewer: Viewer = SEES_ALL,
) -> list[dict[str, Any]]:
    """window_sums' totals (by="") of several windows at once: one query of the minutes and one of
    the hours (or of each of their parts a viewer sees) for all of them, each window's sums filtered
    to its own minutes and hours. The Fleet page's cards read four windows so, not in ten queries."""
    minute_ranges, hour_ranges = [], []
    for since, until in windows:
        first, last = _ceil_hour(since), until.replace(minute=0, second=0, microsecond=0)
        whole = first < last
        edges = [(since, first), (last, until)] if whole else [(since, until)]
        ranges = [Q(minute__gte=a, minute__lt=b) for a, b in edges if a < b] or [
            Q(minute__lt=since, minute__gte=since)
        ]
        minute_ranges.append(Q(*ranges, _connector=Q.OR))
        hour_ranges.append((first, last) if whole else None)
    named = {
        f"{name}_{i}": _filtered(sum_, within)
        for i, within in enumerate(minute_ranges)
        for name, sum_ in sums.items()
    }
    # The rows of any window's minutes, not of the minutes between (a week's window has none but its edges).
    # The servers' ids, not a subquery: with one, the planner took each server's index over the minutes'
    # (a week of a server's rows per server) rather than the windows' minutes (bench_pages' tenant).
    ids = list(servers.values_list("pk", flat=True))
    within = Q(*minute_ranges, _connector=Q.OR)
    parts = [(part, named) for part in _rows(rollups[0], ids, within, by="", viewer=viewer)]
    spans = [span for span in hour_ranges if span]
    if spans:
        hourly = {
            f"{name}_{i}": _filtered(sum_, Q(hour__gte=span[0], hour__lt=span[1]))
            for i, span in enumerate(hour_ranges) if span for name, sum_ in sums.items()
        }  # fmt: skip
        first, last = min(a for a, _ in spans), max(b for _, b in spans)
        parts += [
            (part, hourly)
            for part in _rows(
                rollups[1], servers.values("pk"), Q(hour__gte=first, hour__lt=last), by="", viewer=viewer
            )
        ]
    found: list[dict[str, Any]] = [dict.fromkeys(sums) for _ in windows]
    for part, aggregates in parts:
        row = part.aggregate(**aggregates)
        for i, total in enumerate(found):
            for name in sums:
                total[name] = _combined(name, total[name], row.get(f"{name}_{i}"))
    return found


def _filtered(aggregate: Sum, condition: Q) -> Sum:
    """`aggregate` (a Sum of one column) over the rows meeting `condition` alone."""
    return Sum(aggregate.get_source_expressions()[0], filter=condition)
