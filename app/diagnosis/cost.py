"""The cost of a scope's lost reuse over a window (app/domain/cost.py, the one cost model), read from
the rollups: its lost tokens per cause from the loss rollups, its prefill rate's sums from the request
rollups. The template page, the regressions and the API all price a scope through scope_cost, so the
same scope and window give the same figure everywhere."""

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.diagnosis.reads import window_losses
from app.domain.cost import Cost, Pricing, price_lost_tokens
from app.domain.prefill import PrefillSums
from app.rollups.visibility import visible
from app.traffic.models import HourRollup, MinuteRollup

_PREFILL_SUMS = {
    "count": Sum("prefill_count"), "x": Sum("prefill_uncached_sum"), "y": Sum("prefill_ttft_sum"),
    "xx": Sum("prefill_uncached_squares"), "xy": Sum("prefill_cross_sum"),
}  # fmt: skip


def scope_cost(
    *,
    since: datetime,
    until: datetime,
    server_id: int | None = None,
    template_id: int | None = None,
    tenant: str | None = None,
    viewer: Viewer = SEES_ALL,
    rate_before: float | None = None,
) -> Cost:
    """The cost over [since, until) (a minute counts when it starts in it) of the traffic the viewer
    sees of one server, template or tenant when given (any two of them: a template on a server or for
    a tenant), else of the fleet. A template's scopes count a prompt changing, the others do not
    (app/domain/cost.py). The prefill rate of a tenant's scope is measured on its server's or
    template's requests, else the fleet's: the request rollups have no tenant. With `rate_before`
    (a regression's), also the part of the lost tokens over that rate (Cost.over_before)."""
    lost, reuse = window_losses(
        since=since, until=until, server_id=server_id, template_id=template_id, tenant=tenant, viewer=viewer
    )
    prefill = prefill_sums(
        since=since, until=until, server_id=server_id, template_id=template_id, viewer=viewer
    )
    pricing = Pricing(settings.PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND, settings.PREFIXSCOPE_GPU_HOUR_PRICE)
    return price_lost_tokens(
        lost,
        since=since,
        until=until,
        prefill=prefill,
        pricing=pricing,
        template_scope=template_id is not None,
        before=None if rate_before is None else (rate_before, reuse),
    )


def prefill_sums(
    *,
    since: datetime,
    until: datetime,
    server_id: int | None = None,
    template_id: int | None = None,
    viewer: Viewer = SEES_ALL,
) -> PrefillSums:
    """The TTFT-over-uncached-tokens sums (app/domain/prefill.py) of the requests of [since, until)
    of a server and/or template when given, else of the fleet: the whole hours from the hour
    rollups, the minutes around them from the minute rollups."""
    scope = {"server_id": server_id, "template_id": template_id}
    found = PrefillSums()
    for part in request_rollups(since=since, until=until, viewer=viewer):
        part = part.filter(**{name: value for name, value in scope.items() if value is not None})
        sums = part.aggregate(**_PREFILL_SUMS)
        found += PrefillSums(**{name: value or 0 for name, value in sums.items()})
    return found


def request_rollups(*, since: datetime, until: datetime, viewer: Viewer) -> list[QuerySet[Any]]:
    """The request rollups of [since, until) the viewer sees: the whole hours from the hour rollups,
    the minutes around them from the minute rollups (each part to filter and sum alike)."""
    first = since.replace(minute=0, second=0, microsecond=0)
    first += timedelta(hours=1) if first < since else timedelta(0)
    last = until.replace(minute=0, second=0, microsecond=0)
    if first >= last:
        return [visible(viewer, MinuteRollup.objects.filter(minute__gte=since, minute__lt=until))]
    return [
        visible(viewer, MinuteRollup.objects.filter(minute__gte=since, minute__lt=first)),
        visible(viewer, HourRollup.objects.filter(hour__gte=first, hour__lt=last)),
        visible(viewer, MinuteRollup.objects.filter(minute__gte=last, minute__lt=until)),
    ]
