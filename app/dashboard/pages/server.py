"""One server's page: charts of its hit rate, TTFT, KV usage, evictions and request rate over a
chosen window, its blocks' residency, and what its misses lost, to which cause and to routing.

Every chart's numbers are on the page too (a table under it) and as CSV (`?chart=<slug>&format=csv`,
the same window); the window is in the URL, so a link shows what its sender saw.
"""

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from app.core.http import HtmxHttpRequest
from app.core.tenancy import SEES_ALL, Viewer, viewer_of
from app.dashboard.charts import Chart
from app.dashboard.reads.collection import server_collection
from app.dashboard.windows import WINDOWS, Window, picked_window
from app.diagnosis.reads import lost_tokens_by_cause, server_funnel
from app.domain.misses import OF_COUNTERS, OF_RECORDED, cause_label
from app.fleet.models import Server
from app.rollups import series as traffic_series
from app.rollups.series import Series, SeriesQuery, is_key
from app.traffic.residency import Spread, block_residency, resident_shares
from app.traffic.tier_hits import tier_hits


@login_required
def server_detail(request: HtmxHttpRequest, server: str) -> HttpResponse:
    """A server by id or name: its charts over the window in the URL, or one chart's CSV."""
    if "\x00" in server:
        raise Http404("no such server")
    viewer = viewer_of(request.user)
    found = get_object_or_404(
        viewer.servers(Server.objects.all()), **({"pk": int(server)} if is_key(server) else {"name": server})
    )
    window = picked_window(request.GET, now=timezone.now())
    charts = server_charts(found, window, viewer=viewer)
    if request.GET.get("format") == "csv":
        return _chart_csv(found, charts, request.GET.get("chart", ""))
    context = {"server": found, "window": window, "windows": [*WINDOWS, "custom"], "charts": charts,
               "residency": _residency_rows(found, window), "resident": resident_shares([found])[found.pk],
               "lost": _lost(found, window, viewer),
               "tiers": tier_hits(server_id=found.pk, since=window.since, until=window.until),
               "funnel": server_funnel(server_id=found.pk, since=window.since, until=window.until,
                                       viewer=viewer),
               "collection": server_collection(found, with_samples=request.user.is_staff),
               "query": urlencode(window.params())}  # fmt: skip
    return render(request, "dashboard/server.html", context)


def server_charts(server: Server, window: Window, *, viewer: Viewer = SEES_ALL) -> list[Chart]:
    """The page's charts, each from the series API's selectors over the same window and bucket, of
    the traffic the viewer sees (the server's own readings are the server's, whoever's traffic)."""

    def read(metric: str) -> list[Series]:
        query = SeriesQuery(
            metric, "server", str(server.pk), window.since, window.until, window.bucket, window.ttft
        )
        return traffic_series.series(query, viewer=viewer).series

    requests = read("requests")[0]
    recorded = Series("recorded_rate", [None if v is None else v / window.bucket for v in requests.values])
    ttft = "as clients saw it (gateway, application)" if window.ttft == "client" else "as vLLM measured it"
    tokens_note = f"hit_rate: {OF_RECORDED}. engine_hit_rate: {OF_COUNTERS}"
    evictions_note = "Per bucket; blocks removed come from its KV events, which are kept for hours"
    charts = [
        ("hit-rate", "Hit rate", tokens_note, "ratio", read("hit_rate") + read("engine_hit_rate")),
        ("ttft", "Time to first token", f"p50, p90 and p99, {ttft}", "seconds",
         read("ttft_p50") + read("ttft_p90") + read("ttft_p99")),
        ("kv-usage", "KV cache usage (vLLM)", "Mean of vllm:kv_cache_usage_perc: the blocks running requests "
         "hold. A cached block no request holds is free to vLLM (evictable), so it reads 0 between requests "
         "however full the prefix cache is: see the prefix blocks resident above", "ratio", read("kv_usage")),
        ("evictions", "Evictions and preemptions", evictions_note, "count",
         read("evictions") + read("preemptions")),
        ("request-rate", "Request rate", "Requests per second", "per second",
         [*read("request_rate"), recorded]),
        ("lost-tokens", "Prompt tokens lost, by cause", "Per bucket, from the diagnoses of its requests",
         "tokens", read("lost_tokens")),
    ]  # fmt: skip
    times = traffic_series.bucket_starts(
        SeriesQuery("requests", "server", "", window.since, window.until, window.bucket)
    )
    return [Chart(slug, title, note, unit, found, times) for slug, title, note, unit, found in charts]


def _chart_csv(server: Server, charts: list[Chart], slug: str) -> HttpResponse:
    chart = next((c for c in charts if c.slug == slug), None)
    if chart is None:
        raise Http404("no such chart")
    response = HttpResponse(
        traffic_series.as_csv(chart.times, chart.series), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{server.pk}-{slug}.csv"'
    return response


RESIDENCY_LABELS = {"lifetime": "stayed resident", "idle_before_eviction": "sat idle before eviction",
                    "reuse_gap": "waited between two reuses"}  # fmt: skip


def _residency_rows(server: Server, window: Window) -> list[dict[str, Any]]:
    """The residency table: lifetimes from KV events, then vLLM's three block histograms (cells
    None where it does not expose them)."""
    found = block_residency(server_id=server.pk, since=window.since, until=window.until)
    span = f"KV events, {found.since:%H:%M} to {found.until:%H:%M} UTC"
    rows: list[tuple[str, str, Spread | None]] = [
        ("stayed resident (stored to removed)", span, found.event_lifetime)
    ]
    rows += [(RESIDENCY_LABELS[name], "vLLM's histogram over the window", spread)
             for name, spread in found.engine.items()]  # fmt: skip
    return [
        {"label": label, "source": source, "cells": _spread_cells(spread)} for label, source, spread in rows
    ]


def _spread_cells(spread: Spread | None) -> list[str] | None:
    if spread is None:
        return None
    return [
        f"{spread.count:,}",
        *("—" if v is None else f"{v:,.1f} s" for v in (spread.p50, spread.p90, spread.p99)),
    ]


def _lost(server: Server, window: Window, viewer: Viewer) -> list[tuple[str, int]]:
    lost = lost_tokens_by_cause(since=window.since, until=window.until, server_id=server.pk, viewer=viewer)
    return sorted(((cause_label(c), t) for c, t in lost.items() if t), key=lambda pair: -pair[1])
