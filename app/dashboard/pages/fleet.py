"""The Fleet page: headline cards, every server's row over the window in the URL with its sparkline,
what the last hour's misses lost, and the proposed servers staff accept or merge."""

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from app.core.http import HtmxHttpRequest
from app.core.tenancy import Viewer, viewer_of
from app.dashboard.charts import percent
from app.dashboard.forms import ProposedServerForm
from app.dashboard.reads.fleet import (
    NOW_MINUTES,
    ServerRow,
    fleet_headline,
    fleet_overview,
    hit_rate_sparks,
    proposed_servers,
)
from app.dashboard.sparks import spark
from app.dashboard.windows import WINDOWS, Window, bucket_starts, in_hours, picked_window
from app.diagnosis.reads import LossRow, losses, recent_misses, routing_effectiveness
from app.domain.misses import (
    GATEWAY_CACHE,
    OF_COUNTERS,
    OF_HOSTED,
    OF_PROMPT,
    OF_RECORDED,
    OF_REUSABLE,
    cause_label,
    is_loss,
)
from app.fleet.models import Server
from app.fleet.services import ServerStateError, accept_server
from app.rollups.hitrates import HitRates
from app.rollups.merge import merge_server
from app.rollups.series import Series, as_csv
from app.traffic.residency import resident_shares


@login_required
@require_GET
def home(request: HtmxHttpRequest) -> HttpResponse:
    """The fleet at a glance over the window in the URL; htmx polls refresh only the #fleet-table
    partial; `format=csv` answers the sparklines' numbers."""
    now = timezone.now()
    window = in_hours(picked_window(request.GET, now=now))
    viewer = viewer_of(request.user)
    if request.GET.get("format") == "csv":
        return _sparks_csv(viewer.servers(Server.objects.all()), window)
    if request.GET.get("numbers"):  # the sparklines' numbers, fetched when their table is opened
        return render(
            request,
            "dashboard/home.html#spark-numbers",
            _spark_numbers(viewer.servers(Server.objects.all()), window),
        )
    template = "dashboard/home.html"
    if request.htmx:
        template += "#fleet-table"
    return render(request, template, _fleet(now=now, window=window, viewer=viewer))


@login_required
@require_POST
def proposed_server(request: HtmxHttpRequest, server_id: int) -> HttpResponse:
    """Staff accept a proposed server or merge it into a registered one. Answers with the page
    (a redirect to it, or the page with the form's errors), or for htmx the #proposed-servers
    partial, and an event that refreshes the fleet table once the fleet changed."""
    if not request.user.is_staff:
        raise PermissionDenied
    viewer = viewer_of(request.user)
    if not viewer.servers(Server.objects.filter(pk=server_id)).exists():
        raise Http404("no such server")
    form = ProposedServerForm(request.POST, auto_id=f"proposed-{server_id}-%s")
    if not form.is_valid():
        template = "dashboard/home.html" + ("#proposed-servers" if request.htmx else "")
        return render(request, template, _fleet(now=timezone.now(), invalid={server_id: form}, viewer=viewer))
    try:
        messages.success(request, _decide(server_id, form.cleaned_data))
    except ServerStateError as exc:  # accepted, merged or deleted by someone else meanwhile
        messages.error(request, str(exc))
    if not request.htmx:
        return redirect("dashboard:home")
    response = render(
        request, "dashboard/home.html#proposed-servers", _fleet(now=timezone.now(), viewer=viewer)
    )
    response["HX-Trigger"] = "fleet-changed"
    return response


def _decide(server_id: int, data: dict[str, Any]) -> str:
    if data["action"] == "accept":
        server = accept_server(server_id=server_id, base_url=data["base_url"])
        return f"{server.name} is registered: its /metrics pulls begin."
    merged = merge_server(server_id=server_id, into_id=data["into"].pk)
    moved, joined = merged.moved, merged.joined
    return f"Merged into {data['into']}: {moved} request records moved, {joined} joined to its own."


def _fleet(
    *,
    now: datetime,
    viewer: Viewer,
    window: Window | None = None,
    invalid: dict[int, ProposedServerForm] | None = None,
) -> dict[str, object]:
    """The Fleet page, of what the viewer sees: headline cards, every server (proposed ones last)
    over the window, and the proposed ones each with its form (a posted invalid one with its errors)."""
    window = window or in_hours(picked_window({}, now=now))
    servers = viewer.servers(Server.objects.all())
    proposed = [
        (row, (invalid or {}).get(row.server.pk) or _form_for(row.server))
        for row in proposed_servers(now=now, viewer=viewer)
    ]
    hour_ago = now - timedelta(hours=1)
    head = fleet_headline(servers=servers, now=now, since=window.since, until=window.until, viewer=viewer)
    rows = fleet_overview(
        servers=servers, now=now, since=window.since, until=window.until, bucket=window.bucket, viewer=viewer
    )
    rows.sort(key=lambda row: row.state == "proposed")
    times = bucket_starts(window)
    by_template = losses(since=hour_ago, until=now, by="template_version", viewer=viewer)
    return {
        "window": window, "windows": list(WINDOWS), "query": urlencode({"window": window.key}), "head": head,
        "server_suffix": "" if window.key == "1h" else f"?{urlencode({'window': window.key})}",  # its default
        "head_rates": [(f"now ({NOW_MINUTES} min)", *_percents(head.now)),
                       ("last hour", *_percents(head.hour)), ("last day", *_percents(head.day))],
        "rows": [(row, _spark(row, times, window.bucket) if row.state != "proposed" else None)
                 for row in rows],
        "spark_count": len(times), "proposed": proposed,
        "resident": resident_shares(row.server for row in rows if row.state != "proposed"),
        "lost": sorted(((cause_label(c), t) for c, t in head.lost_tokens.items()), key=lambda pair: -pair[1]),
        "never_reusable": [(cause_label(c), t) for c, t in sorted(head.never_reusable.items())],
        "of_prompt": OF_PROMPT, "of_reusable": OF_REUSABLE, "of_recorded": OF_RECORDED,
        "of_counters": OF_COUNTERS, "of_hosted": OF_HOSTED, "gateway_cache": GATEWAY_CACHE,
        "misses": recent_misses(since=hour_ago, viewer=viewer),
        "by_template": _shown_groups(by_template[:10]),
        "routing": routing_effectiveness(since=hour_ago, until=now, viewer=viewer),
    }  # fmt: skip


def _percents(rates: HitRates) -> tuple[float | None, float | None]:
    return tuple(None if r is None else 100 * r for r in (rates.requests, rates.counters))  # type: ignore[return-value]


def _spark(row: ServerRow, times: list[datetime], bucket: int) -> dict[str, Any]:
    """What static/charts/charts.js draws in a row's sparkline."""
    described = f"{row.server.name}: hit rate per {bucket} s; the numbers are in the table below"
    return spark(f"spark-{row.server.pk}", row.spark, times, name="engine_hit_rate", label="vLLM counters",
                 described=described)  # fmt: skip


def _sparks(servers: QuerySet[Server], window: Window) -> tuple[list[datetime], list[Series]]:
    """Each registered server's counter hit rate per bucket of the window: the sparklines' numbers."""
    registered = servers.exclude(state=Server.State.PROPOSED).order_by("name")
    found = hit_rate_sparks(registered, since=window.since, until=window.until, bucket=window.bucket)
    return bucket_starts(window), [Series(server.name, found[server.pk]) for server in registered]


def _spark_numbers(servers: QuerySet[Server], window: Window) -> dict[str, object]:
    times, found = _sparks(servers, window)
    table = [(at, [percent(s.values[i]) for s in found]) for i, at in enumerate(times)]
    return {"spark_names": [s.name for s in found], "spark_table": table}


def _sparks_csv(servers: QuerySet[Server], window: Window) -> HttpResponse:
    """The sparklines' numbers: a `time` column, then each server's counter hit rate per bucket."""
    times, found = _sparks(servers, window)
    response = HttpResponse(as_csv(times, found), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="fleet-hit-rate-{window.key}.csv"'
    return response


def _shown_groups(rows: list[LossRow]) -> list[dict[str, object]]:
    return [
        {
            "group": row.group,
            "requests": row.requests,
            "funnel": row.funnel,
            "shown_lost": sorted(
                ((cause_label(c), t) for c, t in row.lost.items() if is_loss(c)), key=lambda pair: -pair[1]
            ),
            "new_content": row.lost.get("new_content", 0),
        }
        for row in rows
    ]


def _form_for(server: Server) -> ProposedServerForm:
    return ProposedServerForm(initial={"base_url": server.base_url}, auto_id=f"proposed-{server.pk}-%s")
