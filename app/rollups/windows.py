"""Which sum tables answer a window: whole hours from the hour sums, whole quarters from the
quarter sums, the minutes at the edges from the minute sums; each part as the viewer may see it."""

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet, Sum

from app.core.tenancy import Viewer
from app.rollups.visibility import visible, visible_sums
from app.traffic.models import (
    LossHour,
    LossMinute,
    ServerLossHour,
    ServerLossMinute,
    ServerLossQuarter,
)


def loss_minutes(*, since: datetime, until: datetime, viewer: Viewer) -> QuerySet[LossMinute]:
    return visible(viewer, LossMinute.objects.filter(minute__gte=since, minute__lt=until))


def loss_rollups(*, since: datetime, until: datetime, viewer: Viewer) -> list[QuerySet[Any]]:
    """The loss rollups of the minutes from `since` to `until`: the whole hours from the hours, the
    minutes around them from the minutes. A week of a fleet's minutes was millions of rows to sum
    per request (bench/bench_pages.py); its hours are at most servers x templates x 168."""
    first = since.replace(minute=0, second=0, microsecond=0)
    first += timedelta(hours=1) if first < since else timedelta(0)
    last = until.replace(minute=0, second=0, microsecond=0)
    if first >= last:
        return [loss_minutes(since=since, until=until, viewer=viewer)]
    hours = visible(viewer, LossHour.objects.filter(hour__gte=first, hour__lt=last))
    return [
        loss_minutes(since=since, until=first, viewer=viewer),
        hours,
        loss_minutes(since=last, until=until, viewer=viewer),
    ]


def loss_sums(*, since: datetime, until: datetime, viewer: Viewer) -> list[QuerySet[Any]]:
    """loss_rollups' rows as read for sums per server or in total: from the sums per server and
    tenant (ServerLossMinute, ServerLossHour: an hour of a fleet is servers x 60 rows, not x templates
    too) and, for a viewer of some tenants, the rows of its templates on other servers from the
    per-template rollups (visibility.visible_sums)."""
    first = since.replace(minute=0, second=0, microsecond=0)
    first += timedelta(hours=1) if first < since else timedelta(0)
    last = until.replace(minute=0, second=0, microsecond=0)
    spans: list[tuple[type[Any], type[Any], Q]] = (
        [(LossMinute, ServerLossMinute, Q(minute__gte=since, minute__lt=until))]
        if first >= last
        else [
            (LossMinute, ServerLossMinute, Q(minute__gte=since, minute__lt=first)),
            (LossHour, ServerLossHour, Q(hour__gte=first, hour__lt=last)),
            (LossMinute, ServerLossMinute, Q(minute__gte=last, minute__lt=until)),
        ]
    )
    return [
        part
        for fine, summed, within in spans
        for part in visible_sums(viewer, summed.objects.filter(within), fine.objects.filter(within))
    ]


def summed(
    parts: list[QuerySet[Any]], *, keys: tuple[str, ...], sums: dict[str, Sum]
) -> list[dict[str, Any]]:
    """`sums` per value of `keys` (one row of them all when none) over the rows of every part."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for part in parts:
        rows = part.values(*keys).annotate(**sums) if keys else [part.aggregate(**sums)]
        for row in rows:
            total = found.setdefault(tuple(row[key] for key in keys), {key: row[key] for key in keys})
            for name in sums:  # a sum over no rows is None: 0 here
                total[name] = total.get(name, 0) + (row[name] or 0)
    return list(found.values())


def tenant_loss_rollups(*, since: datetime, until: datetime, viewer: Viewer) -> list[QuerySet[Any]]:
    """loss_rollups() for sums per tenant, read from the loss sums per server and tenant where they
    serve: whole hours from ServerLossHour, whole quarter hours around them from ServerLossQuarter, the
    minutes around those from LossMinute (an hour's window was up to 118 loss minutes of every server,
    template and version; now 28 at most). visibility.visible_sums says which rows of the sums the viewer
    sees, and reads the rest (tenant-less rows of its templates on others' servers) from the rollups
    per template."""
    quarters = _ceil_quarter(since), _floor_quarter(until)
    if quarters[0] >= quarters[1]:
        return [loss_minutes(since=since, until=until, viewer=viewer)]
    hours = ceil_hour(since), until.replace(minute=0, second=0, microsecond=0)
    spans = [(quarters[0], hours[0]), (hours[1], quarters[1])] if hours[0] < hours[1] else [quarters]
    parts = [loss_minutes(since=since, until=quarters[0], viewer=viewer),
             loss_minutes(since=quarters[1], until=until, viewer=viewer)]  # fmt: skip
    for start, end in spans:
        if start < end:
            quarter, minute = ServerLossQuarter.objects.all(), LossMinute.objects.all()
            within = Q(minute__gte=start, minute__lt=end)
            parts += visible_sums(viewer, quarter.filter(within), minute.filter(within))
    if hours[0] < hours[1]:
        hour_span = {"hour__gte": hours[0], "hour__lt": hours[1]}
        parts += visible_sums(
            viewer, ServerLossHour.objects.filter(**hour_span), LossHour.objects.filter(**hour_span)
        )
    return parts


def _ceil_quarter(moment: datetime) -> datetime:
    floor = _floor_quarter(moment)
    return floor if floor == moment else floor + timedelta(minutes=15)


def _floor_quarter(moment: datetime) -> datetime:
    return moment.replace(minute=moment.minute - moment.minute % 15, second=0, microsecond=0)


def ceil_hour(moment: datetime) -> datetime:
    floor = moment.replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + timedelta(hours=1)
