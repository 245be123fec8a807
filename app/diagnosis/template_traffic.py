"""Each template's live traffic over a window, as the template check prices a change with it
(issue 25): its requests an hour, prompt and reused tokens per request, the block size that served
it and its measured prefill rate. Read from the request rollups, never raw request records; the
prefill rate through app/diagnosis/cost.py, the one cost model's.

Requests an hour count from the template's first request in the window when that is later than the
window's start: a template live for ten minutes is not spread over a day. The checks of imported
versions are priced here too (``price_version_checks``), with the traffic of the day before each
check, by app/domain/templatecheck/price.py.
"""

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Min, Q, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.diagnosis.cost import configured_pricing, prefill_sums_by_template, request_rollups
from app.domain.cost import prefill_rate
from app.domain.hitrate import RequestSums
from app.domain.prefill import PrefillSums
from app.domain.templatecheck.change import Change
from app.domain.templatecheck.price import Predicted, Traffic, predict
from app.fleet.models import Server
from app.prompts import services
from app.prompts.models import Template, VersionCheck
from app.rollups.visibility import visible
from app.traffic.models import MinuteRollup

RECENT = timedelta(hours=1)  # "reused now": the window's last hour
DAY = timedelta(hours=24)  # the traffic a version's check is priced with: the day before it
_TOTALS = {
    name: Sum(name) for name in ("requests", "prompt_tokens", "cached_tokens", "cache_known_prompt_tokens")
}
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Totals:
    """A template's request rollups summed over some rows, and when its first request came."""

    sums: RequestSums = field(default_factory=RequestSums)
    first: datetime | None = None  # the start of the first minute (or hour) with a request

    def __add__(self, other: "Totals") -> "Totals":
        firsts = [first for first in (self.first, other.first) if first is not None]
        return Totals(self.sums + other.sums, min(firsts, default=None))


@dataclass(frozen=True, slots=True)
class TemplateTraffic:
    """One template's traffic over a window (app/api/template_traffic.py documents each field)."""

    name: str
    repository: str | None
    path: str
    requests: int
    requests_per_hour: float
    prompt_tokens_per_request: float
    reused_tokens_per_request: float
    reused_window: str  # "hour" (the last hour) or "window" (the last hour reported no cached tokens)
    block_size: int | None
    prefill_tokens_per_second: float
    prefill_rate_source: str  # "measured" or "configured"


@dataclass(frozen=True, slots=True)
class TrafficWindow:
    since: datetime
    until: datetime
    recent_since: datetime

    @property
    def hours(self) -> float:
        return (self.until - self.since) / timedelta(hours=1)

    def active_hours(self, first: datetime | None) -> float:
        """The window's hours from ``first`` (a template's first request) on when that is later;
        a minute at least."""
        since = max(self.since, first) if first is not None else self.since
        return max((self.until - since) / timedelta(hours=1), 1 / 60)


def traffic_window(*, now: datetime, hours: int) -> TrafficWindow:
    """[now - hours, now) on whole minutes (the current minute, still filling, left out), and its
    last hour (the whole window when it is one hour or less)."""
    until = now.replace(second=0, microsecond=0)
    since = until - timedelta(hours=hours)
    return TrafficWindow(since=since, until=until, recent_since=max(since, until - RECENT))


def template_traffic(
    templates: Sequence[Template], *, window: TrafficWindow, viewer: Viewer = SEES_ALL
) -> list[TemplateTraffic]:
    """The traffic of each of `templates` over the window, in their order, of the rollup rows the
    viewer sees (app/rollups/visibility.py); a template without a request has zeros. The prefill
    rate is the one its requests of the window measure, else the configured one."""
    ids = [template.pk for template in templates]
    per_server = _totals_by_server(ids, since=window.since, until=window.until, viewer=viewer)
    firsts = _first_minutes(per_server, viewer=viewer)
    recent = _recent_totals(ids, since=window.recent_since, until=window.until, viewer=viewer)
    prefill = prefill_sums_by_template(
        since=window.since, until=window.until, template_ids=ids, viewer=viewer
    )
    block_sizes = _block_sizes({server for servers in per_server.values() for server in servers})
    return [
        _traffic(
            template,
            window,
            per_server.get(template.pk, {}),
            firsts.get(template.pk),
            recent.get(template.pk, Totals()),
            prefill.get(template.pk, PrefillSums()),
            block_sizes,
        )
        for template in templates
    ]


def _traffic(
    template: Template,
    window: TrafficWindow,
    servers: dict[int, Totals],
    first: datetime | None,
    recent: Totals,
    prefill: PrefillSums,
    block_sizes: dict[int, int],
) -> TemplateTraffic:
    whole = sum(servers.values(), Totals()).sums
    reused_now = recent.sums.reused_per_request()
    rate = prefill_rate(prefill, configured_pricing())
    return TemplateTraffic(
        name=template.name,
        repository=template.repository.name if template.repository else None,
        path=template.path,
        requests=whole.requests,
        requests_per_hour=whole.requests / window.active_hours(first),
        prompt_tokens_per_request=whole.prompt_tokens / whole.requests if whole.requests else 0.0,
        reused_tokens_per_request=reused_now if reused_now is not None else whole.reused_per_request() or 0.0,
        reused_window="hour" if reused_now is not None else "window",
        block_size=_served_block_size(servers, block_sizes),
        prefill_tokens_per_second=rate.tokens_per_second,
        prefill_rate_source=rate.source,
    )


def _served_block_size(servers: dict[int, Totals], block_sizes: dict[int, int]) -> int | None:
    """The block size of the servers that served the most of the requests (of those whose block size
    is known; the smaller one on a tie); None when none is known."""
    requests: dict[int, int] = {}
    for server, totals in servers.items():
        if server in block_sizes and totals.sums.requests:
            requests[block_sizes[server]] = requests.get(block_sizes[server], 0) + totals.sums.requests
    return max(sorted(requests), key=requests.__getitem__, default=None)


def _totals_by_server(
    ids: list[int], *, since: datetime, until: datetime, viewer: Viewer
) -> dict[int, dict[int, Totals]]:
    """Each template's totals per server over [since, until): {template: {server: Totals}}."""
    found: dict[int, dict[int, Totals]] = {}
    for part in request_rollups(since=since, until=until, viewer=viewer):
        time = "minute" if part.model is MinuteRollup else "hour"
        rows = part.filter(template_id__in=ids, requests__gt=0)
        for row in _summed(rows, "template_id", "server_id", first=Min(time)):
            servers = found.setdefault(row["template_id"], {})
            servers[row["server_id"]] = servers.get(row["server_id"], Totals()) + _totals(row)
    return found


def _first_minutes(per_server: dict[int, dict[int, Totals]], *, viewer: Viewer) -> dict[int, datetime]:
    """Each template's first minute with a request: the first row's time (an hour's start, when the
    hour rollups held it) made exact from the minute rollups of that hour where they are kept. One
    query for every template."""
    firsts = {
        template_id: min(f for t in servers.values() if (f := t.first) is not None)
        for template_id, servers in per_server.items()
        if any(t.first is not None for t in servers.values())
    }
    if not firsts:
        return {}
    hours = Q()
    for template_id, first in firsts.items():
        hours |= Q(template_id=template_id, minute__gte=first, minute__lt=first + timedelta(hours=1))
    rows = visible(viewer, MinuteRollup.objects.filter(hours, requests__gt=0))
    exact = rows.values("template_id").annotate(first=Min("minute"))
    return firsts | {row["template_id"]: row["first"] for row in exact}


def _recent_totals(ids: list[int], *, since: datetime, until: datetime, viewer: Viewer) -> dict[int, Totals]:
    """Each template's totals over [since, until), a window of an hour at most: the minute rollups."""
    rows = visible(
        viewer, MinuteRollup.objects.filter(minute__gte=since, minute__lt=until, template_id__in=ids)
    )
    return {row["template_id"]: _totals(row) for row in _summed(rows, "template_id")}


def _summed(rows: Any, *keys: str, **extra: Any) -> Iterable[dict[str, Any]]:
    summed: Iterable[dict[str, Any]] = rows.values(*keys).annotate(**_TOTALS, **extra)
    return summed


def _totals(row: dict[str, Any]) -> Totals:
    requests, prompt, cached, known = (row[name] or 0 for name in _TOTALS)
    return Totals(RequestSums(requests, prompt, cached, known), row.get("first"))


def _block_sizes(server_ids: set[int]) -> dict[int, int]:
    """The known block size of each server. Of any server that served the viewer's templates: the
    number is read from the viewer's own traffic's rows, and no server's name goes with it."""
    rows = Server.objects.filter(pk__in=server_ids, block_size__isnull=False).values_list("pk", "block_size")
    return {pk: size for pk, size in rows if size is not None}


def check_traffic(
    templates: Sequence[Template], *, window: TrafficWindow, viewer: Viewer = SEES_ALL
) -> dict[str, Traffic]:
    """template_traffic as the template check prices with it (app/domain/templatecheck/price.py), by
    name; templates without a request are left out."""
    price = configured_pricing().gpu_hour_price
    rows = template_traffic(templates, window=window, viewer=viewer)
    return {row.name: _check_traffic(row, price=price, hours=window.hours) for row in rows if row.requests}


def _check_traffic(row: TemplateTraffic, *, price: float, hours: float) -> Traffic:
    return Traffic(
        row.name, row.requests, row.requests_per_hour, row.reused_tokens_per_request,
        row.prompt_tokens_per_request, row.block_size, row.prefill_tokens_per_second,
        row.prefill_rate_source, price, hours,
    )  # fmt: skip


def price_version_checks(*, version_ids: Sequence[int], now: datetime) -> int:
    """Price the checks of these versions not priced yet with their template's traffic of the day
    before each check; a check with nothing to compare (a template's first version, or one that
    could not run) or whose template had no traffic is marked priced with no price. How many got one."""
    checks = VersionCheck.objects.filter(version_id__in=version_ids, priced_at__isnull=True)
    priced = 0
    for check in checks.select_related("version__template"):
        predicted = _predicted(check)
        services.price_version_check(check=check, predicted=predicted, now=now)
        priced += predicted is not None
    logger.info("priced %d of %d version checks", priced, len(version_ids))
    return priced


def _predicted(check: VersionCheck) -> Predicted | None:
    figures = (check.base_stable_tokens, check.head_stable_tokens, check.base_blocks, check.head_blocks)
    if check.block_size is None or any(figure is None for figure in figures):
        return None
    template = check.version.template
    until = check.checked_at
    window = TrafficWindow(since=until - DAY, until=until, recent_since=until - RECENT)
    traffic = check_traffic([template], window=window).get(template.name)
    if traffic is None:
        return None
    change = Change(
        check.departs_at_token, check.departs_line, check.base_stable_tokens or 0,
        check.head_stable_tokens or 0, check.base_blocks or 0, check.head_blocks or 0, None,
    )  # fmt: skip
    return predict(traffic, change, block_size=check.block_size)
