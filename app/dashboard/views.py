import hmac
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from app.compare.killers import Samples, visible_killers
from app.core.http import HtmxHttpRequest
from app.core.tenancy import Viewer, viewer_of
from app.dashboard.explorer import request_extras, request_page_url
from app.dashboard.forms import ProposedServerForm
from app.dashboard.metrics import PrefixscopeCollector
from app.dashboard.selectors import (
    NOW_MINUTES,
    HitRates,
    ServerRow,
    collection_health,
    fleet_headline,
    fleet_overview,
    hit_rate_sparks,
    proposed_servers,
)
from app.dashboard.server_page import WINDOWS, Window, picked_window
from app.dashboard.sparks import spark
from app.diagnosis.reads import LossRow, losses, recent_misses, routing_effectiveness, unexpected_hits
from app.diagnosis.tenants import shared_unsalted_prefixes, tenant_audit
from app.fleet.models import Server
from app.fleet.services import ServerStateError, accept_server
from app.prompts.killers import SampleKey, killer_at, template_killers
from app.prompts.models import CacheKiller
from app.rollups.merge import merge_server
from app.rollups.series import Series, as_csv
from app.traffic.models import RequestDiagnosis
from app.traffic.residency import resident_shares
from app.traffic.selectors import addressed_request

_registry = CollectorRegistry()
_registry.register(PrefixscopeCollector())


@require_GET
@never_cache
def metrics(request: HtmxHttpRequest) -> HttpResponse:
    """Prometheus text exposition of Prefixscope's own state (see app/dashboard/metrics.py); with
    PREFIXSCOPE_METRICS_BEARER_TOKEN set, only to a caller sending it (else a 401)."""
    if not _may_scrape(request):
        refused = HttpResponse(
            "send PREFIXSCOPE_METRICS_BEARER_TOKEN as `Authorization: Bearer <token>`\n",
            status=401, content_type="text/plain; charset=utf-8",
        )  # fmt: skip
        refused["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return refused
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)


def _may_scrape(request: HtmxHttpRequest) -> bool:
    """True when no metrics token is set, or the request's bearer credentials are that token,
    compared in constant time (a timing difference would leak it a character at a time)."""
    expected = settings.PREFIXSCOPE_METRICS_BEARER_TOKEN
    if not expected:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


@login_required
@require_GET
def home(request: HtmxHttpRequest) -> HttpResponse:
    """The fleet at a glance over the window in the URL; htmx polls refresh only the #fleet-table
    partial; `format=csv` answers the sparklines' numbers."""
    now = timezone.now()
    window = _in_hours(picked_window(request.GET, now=now))
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
    window = window or _in_hours(picked_window({}, now=now))
    servers = viewer.servers(Server.objects.all())
    proposed = [
        (row, (invalid or {}).get(row.server.pk) or _form_for(row.server))
        for row in proposed_servers(now=now, viewer=viewer)
    ]
    hour_ago = now - timedelta(hours=1)
    labels = dict(RequestDiagnosis.Cause.choices)
    head = fleet_headline(servers=servers, now=now, since=window.since, until=window.until, viewer=viewer)
    rows = fleet_overview(
        servers=servers, now=now, since=window.since, until=window.until, bucket=window.bucket, viewer=viewer
    )
    rows.sort(key=lambda row: row.state == "proposed")
    times = _bucket_starts(window)
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
        "lost": sorted(((labels[c], t) for c, t in head.lost_tokens.items()), key=lambda pair: -pair[1]),
        "misses": recent_misses(since=hour_ago, viewer=viewer),
        "by_template": _shown_groups(by_template[:10]),
        "routing": routing_effectiveness(since=hour_ago, until=now, viewer=viewer),
    }  # fmt: skip


def _percents(rates: HitRates) -> tuple[float | None, float | None]:
    return tuple(None if r is None else 100 * r for r in (rates.requests, rates.counters))  # type: ignore[return-value]


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _spark(row: ServerRow, times: list[datetime], bucket: int) -> dict[str, Any]:
    """What static/charts/charts.js draws in a row's sparkline."""
    described = f"{row.server.name}: hit rate per {bucket} s; the numbers are in the table below"
    return spark(f"spark-{row.server.pk}", row.spark, times, name="engine_hit_rate", label="vLLM counters",
                 described=described)  # fmt: skip


def _sparks(servers: QuerySet[Server], window: Window) -> tuple[list[datetime], list[Series]]:
    """Each registered server's counter hit rate per bucket of the window: the sparklines' numbers."""
    registered = servers.exclude(state=Server.State.PROPOSED).order_by("name")
    found = hit_rate_sparks(registered, since=window.since, until=window.until, bucket=window.bucket)
    return _bucket_starts(window), [Series(server.name, found[server.pk]) for server in registered]


def _spark_numbers(servers: QuerySet[Server], window: Window) -> dict[str, object]:
    times, found = _sparks(servers, window)
    table = [(at, [_ratio(s.values[i]) for s in found]) for i, at in enumerate(times)]
    return {"spark_names": [s.name for s in found], "spark_table": table}


def _sparks_csv(servers: QuerySet[Server], window: Window) -> HttpResponse:
    """The sparklines' numbers: a `time` column, then each server's counter hit rate per bucket."""
    times, found = _sparks(servers, window)
    response = HttpResponse(as_csv(times, found), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="fleet-hit-rate-{window.key}.csv"'
    return response


def _in_hours(window: Window) -> Window:
    """A window of a day or more in whole hours, drawn by the hour: its sums and sparklines then read
    the hour rollups alone (a day of a fleet's minutes is 1,440 rows per server)."""
    if window.until - window.since < timedelta(days=1):
        return window
    since = window.since.replace(minute=0, second=0, microsecond=0)
    until = window.until.replace(minute=0, second=0, microsecond=0)
    return replace(window, since=since, until=until if until == window.until else until + timedelta(hours=1),
                   bucket=3600)  # fmt: skip


def _bucket_starts(window: Window) -> list[datetime]:
    count = int((window.until - window.since).total_seconds()) // window.bucket
    return [window.since + timedelta(seconds=i * window.bucket) for i in range(count)]


def _shown_groups(rows: list[LossRow]) -> list[dict[str, object]]:
    labels = dict(RequestDiagnosis.Cause.choices)
    return [
        {
            "group": row.group,
            "requests": row.requests,
            "funnel": row.funnel,
            "shown_lost": sorted(((labels[c], t) for c, t in row.lost.items()), key=lambda pair: -pair[1]),
        }
        for row in rows
    ]


def _form_for(server: Server) -> ProposedServerForm:
    return ProposedServerForm(initial={"base_url": server.base_url}, auto_id=f"proposed-{server.pk}-%s")


@login_required
def collection(request: HtmxHttpRequest) -> HttpResponse:
    """Whether every server is heard: pulls, KV event streams, gaps and refused input."""
    rows, reasons, gaps = collection_health(viewer=viewer_of(request.user))
    return render(request, "dashboard/collection.html", {"rows": rows, "reasons": reasons, "gaps": gaps})


@login_required
def request_detail(request: HtmxHttpRequest, server: str, request_id: str) -> HttpResponse:
    """One request (the latest of its id on its server, or the one arrived at `?at=`) with why its
    prompt tokens were not reused, the cache killers of its template under its salt, marking the one
    its divergence is at, and links to the other requests a client sent under the same id."""
    viewer = viewer_of(request.user)
    found = addressed_request(
        server_name=server, request_id=request_id, arrived_at=_arrival(request.GET.get("at")), viewer=viewer
    )
    if found is None:
        raise Http404("no such request")
    i = found.request
    names = dict(viewer.servers(Server.objects.all()).values_list("pk", "name"))
    killers = list(template_killers(i.record.template_id)) if i.record.template_id is not None else []
    killers, seen = visible_killers(killers, viewer=viewer)
    salted = [k for k in killers if k.salt_hash == i.record.salt_hash]
    diverged_at = i.diagnosis.diverged_at if i.diagnosis else None
    here = killer_at(salted, salt_hash=i.record.salt_hash, diverged_at=diverged_at)
    extras = request_extras(i, user=request.user, names=names, now=timezone.now(), viewer=viewer)
    item = {"record": i.record, "diagnosis": i.diagnosis, "losses": _shown_losses(i.diagnosis, names),
            "departure": departure(i.diagnosis, block_size=i.record.server.block_size),
            "killers": _killer_rows(salted, names, {}, here=here, seen=seen), "at_killer": here,
            **extras}  # fmt: skip
    others = [(at, request_page_url(server, request_id, at)) for at in found.others]
    return render(
        request, "dashboard/request.html",
        {"server": server, "request_id": request_id, "found": [item], "others": others,
         "other_count": found.other_count},
    )  # fmt: skip


def _arrival(text: str | None) -> datetime | None:
    """`?at=`: an ISO 8601 arrival (UTC without a zone); a value that is not one names no request."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise Http404("no such request") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _interval(seconds: int) -> str:
    """300 -> "5 minutes", 60 -> "minute", 90 -> "90 seconds": for "searched every ..."."""
    if seconds % 60:
        return f"{seconds} seconds"
    return "minute" if seconds == 60 else f"{seconds // 60} minutes"


@dataclass(frozen=True, slots=True)
class KillerRow:
    killer: CacheKiller
    where: str  # "token 412 (block 25)", or "block 25" in hash-only mode
    sample_links: list[tuple[str, str]]  # (request id, its page)
    samples: Samples | None  # None: not shown to this viewer (or on this page)
    here: bool


def _killer_rows(
    killers: Sequence[CacheKiller],
    names: dict[int, str],
    samples: dict[int, Samples],
    *,
    here: CacheKiller | None = None,
    seen: set[SampleKey],
) -> list[KillerRow]:
    """The killers' rows, linking to the sample requests the viewer sees (`seen`)."""
    rows = []
    for killer in killers:
        block = f"block {killer.block_index}"
        where = block if killer.position_token is None else f"token {killer.position_token} ({block})"
        keys = [key for stored in killer.samples if (key := SampleKey.of(stored)) in seen]
        links = [
            (
                k.request_id,
                reverse("dashboard:request-detail", args=[names.get(k.server_id, "?"), k.request_id]),
            )
            for k in keys
        ]
        rows.append(
            KillerRow(killer, where, links, samples.get(killer.pk), here is not None and here.pk == killer.pk)
        )
    return rows


@dataclass(frozen=True, slots=True)
class Departure:
    """Where a prompt-changed request departs, worded as its lost tokens are listed.

    `at` is the diagnosis' token where the prompt departs from its template's earlier prompts under
    its own salt (token-exact); its losses are by block. When `at` lies in a block lost to another
    cause (a salted request whose first block another tenant's salt had: no block of it was shared
    under its own salt), the prompt-changed loss starts later, at `changed_from`, and `lost_to` names
    the cause of the block `at` lies in."""

    at: int
    changed_from: int
    block: int | None
    lost_to: str  # "" when `at` lies in the prompt-changed loss itself


def departure(diagnosis: RequestDiagnosis | None, *, block_size: int | None) -> Departure | None:
    if diagnosis is None or diagnosis.diverged_at is None:
        return None
    at, losses, changed_from = diagnosis.diverged_at, diagnosis.losses, diagnosis.changed_from
    if changed_from is None or at >= changed_from:
        return Departure(at, at, None, "")
    holding = next(
        (loss for loss in losses if loss["first_token"] <= at < loss["first_token"] + loss["tokens"]), None
    )
    label = (
        dict(RequestDiagnosis.Cause.choices).get(holding["cause"], holding["cause"])
        if holding
        else "not lost"
    )
    return Departure(at, changed_from, at // block_size if block_size else None, label.lower())


def _shown_losses(diagnosis: RequestDiagnosis | None, names: dict[int, str]) -> list[dict[str, object]]:
    labels = dict(RequestDiagnosis.Cause.choices)
    shown = []
    for loss in diagnosis.losses if diagnosis else []:
        detail = ""
        if loss["cause"] == "routed_elsewhere":
            detail = (
                f"resident on {names.get(loss['server_id'], '?')}: its first {loss['server_tokens']} tokens"
            )
        elif loss["cause"] == "evicted":
            where = names.get(loss.get("server_id"), "?")
            stored = loss.get("stored_at", "before the events kept")
            detail = f"on {where}: stored {stored}, removed {loss['removed_at']}"
        first = loss["first_token"]
        shown.append(
            {"first_token": first, "last_token": first + loss["tokens"] - 1, "tokens": loss["tokens"],
             "label": labels.get(loss["cause"], loss["cause"]), "detail": detail}
        )  # fmt: skip
    return shown


@login_required
def tenants(request: HtmxHttpRequest) -> HttpResponse:
    """Each tenant's hit rate and lost tokens over the window in the URL, and the salt audit: what
    isolation cost, the hits it should not have had, and the prefixes tenants share with no salt."""
    window, viewer = picked_window(request.GET, now=timezone.now()), viewer_of(request.user)
    since, until = window.since, window.until
    context = {"tenants": tenant_audit(since=since, until=until, viewer=viewer),
               "hits": unexpected_hits(since=since, until=until, viewer=viewer),
               "shared": shared_unsalted_prefixes(since=since, until=until, viewer=viewer),
               "window": window, "windows": [*WINDOWS, "custom"]}  # fmt: skip
    return render(request, "dashboard/tenants.html", context)
