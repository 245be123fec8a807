"""The Templates list and a template's page.

The list: every template's delivered hit rate over the window in the URL, its change against the
window before, the prompt tokens its requests lost and its open regressions; sortable, the sort in
the URL too. The page: hit rate, TTFT, lost tokens and requests over the window with a marker where
each version went live (a marker opens the version: its diff and its effect), its miss causes,
cache killers, prefix families, what its lost reuse costs, and the KV memory its prefix holds.

Every number comes from the per-minute or hourly rollups, never raw request records; every chart's
numbers are a table on the page and a CSV (`?chart=<slug>&format=csv`).
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone

from app.compare.killers import killer_samples, visible_killers
from app.core.http import HtmxHttpRequest
from app.core.tenancy import SEES_ALL, Viewer, viewer_of
from app.dashboard.charts import Chart, percent
from app.dashboard.killer_rows import killer_rows
from app.dashboard.pages.template_checks import ChecksChart, check_rows
from app.dashboard.pages.template_versions import picked_version, version_panel
from app.dashboard.reads import templates as selectors
from app.dashboard.reads.templates import ListSums, TemplateRequests
from app.dashboard.sparks import spark
from app.dashboard.windows import WINDOWS, Window, bucket_starts, in_hours, picked_window
from app.diagnosis.cost import scope_cost
from app.domain.cost import Cost
from app.domain.hitrate import RequestSums
from app.domain.kvmemory import kv_bytes_for_tokens, kv_bytes_per_token
from app.domain.misses import GATEWAY_CACHE, OF_RECORDED, cause_label
from app.domain.sketch import sketch_quantile
from app.fleet.models import Server
from app.prompts.killers import may_read_prompts, template_killers
from app.prompts.models import Template
from app.prompts.selectors import LiveVersion, live_versions
from app.rollups import series as traffic_series
from app.rollups.series import Series, SeriesQuery
from app.traffic.models import LOST_COLUMNS

SORTS = ("name", "requests", "hit_rate", "change", "lost", "regressions")
# Causes a cache could not have helped: a prompt seen for the first time, a tail shorter than a block.


@dataclass(frozen=True, slots=True)
class TemplateRow:
    template: Template
    now: RequestSums
    before: RequestSums  # the window of the same length just before
    lost_tokens: int
    open_regressions: int

    @property
    def change(self) -> float | None:
        if self.now.hit_rate is None or self.before.hit_rate is None:
            return None
        return self.now.hit_rate - self.before.hit_rate

    @property
    def shown_hit_rate(self) -> str:
        return percent(self.now.hit_rate)

    @property
    def change_points(self) -> str:
        """The change in percentage points, signed: "+3.1 pp"."""
        return "—" if self.change is None else f"{100 * self.change:+.1f} pp"


def _sort_key(key: str) -> Any:
    values = {"name": lambda r: r.template.name, "requests": lambda r: r.now.requests,
              "hit_rate": lambda r: r.now.hit_rate, "change": lambda r: r.change,
              "lost": lambda r: r.lost_tokens, "regressions": lambda r: r.open_regressions}  # fmt: skip
    return values[key]


def template_rows(
    window: Window, sums: ListSums, *, sort: str, viewer: Viewer = SEES_ALL
) -> list[TemplateRow]:
    """Every template with its figures over the window and the one before (`sums`), sorted by `sort`
    (a field of SORTS, "-" first for descending); templates without a figure last."""
    now, before = sums.now, sums.before
    lost = selectors.lost_by_template(since=window.since, until=window.until, viewer=viewer)
    regressions = selectors.open_regressions_by_template(viewer=viewer)
    rows = [
        TemplateRow(t, now.get(t.pk, RequestSums()), before.get(t.pk, RequestSums()),
                    sum(lost.get(t.pk, {}).values()), regressions.get(t.pk, 0))
        for t in viewer.templates(Template.objects.all())
    ]  # fmt: skip
    field = sort.lstrip("-")
    value = _sort_key(field if field in SORTS else "lost")
    known = sorted((r for r in rows if value(r) is not None), key=value, reverse=sort.startswith("-"))
    return known + [r for r in rows if value(r) is None]


@login_required
def template_list(request: HtmxHttpRequest) -> HttpResponse:
    """Every template, its hit rate, trend, lost tokens and open regressions, over the window asked for
    (a window of a day or more in whole hours, read from the hour rollups); `numbers=1` answers the
    trends' numbers as a table, `format=csv` as CSV."""
    window, viewer = in_hours(picked_window(request.GET, now=timezone.now())), viewer_of(request.user)
    if request.GET.get("format") == "csv" or request.GET.get("numbers"):
        return _trend_numbers(request, window, viewer)
    sort = request.GET.get("sort", "-lost")
    sort = sort if sort.lstrip("-") in SORTS else "-lost"
    sums = selectors.list_sums(since=window.since, until=window.until, bucket=window.bucket, viewer=viewer)
    rows, trends = template_rows(window, sums, sort=sort, viewer=viewer), sums.trends
    times = bucket_starts(window)
    query = urlencode(window.params())
    headers = [(field, label, f"?{query}&sort={_next_sort(sort, field)}", _aria_sort(sort, field))
               for field, label in (("name", "Template"), ("requests", "Requests"), ("hit_rate", "Hit rate"),
                                    ("change", "Change"), ("lost", "Prompt tokens lost"),
                                    ("regressions", "Open regressions"))]  # fmt: skip
    context = {"rows": [(row, _trend(row.template, trends, times, window.bucket)) for row in rows],
               "window": window, "windows": [*WINDOWS, "custom"], "sort": sort, "headers": headers,
               "query": query, "trend_count": len(times)}  # fmt: skip
    return render(request, "dashboard/templates.html", context)


def _trend(
    template: Template, trends: dict[int, list[float | None]], times: list[datetime], bucket: int
) -> Any:
    values = trends.get(template.pk, [None] * len(times))
    described = f"{template.name}: hit rate per {bucket} s; the numbers are in the table below"
    return spark(
        f"trend-{template.pk}", values, times, name="hit_rate", label="Requests", described=described
    )


def _trend_numbers(request: HtmxHttpRequest, window: Window, viewer: Viewer) -> HttpResponse:
    """The trends' numbers: every template the viewer sees with a request in the window, by name, its
    hit rate per bucket; as the Fleet page's sparkline table, or as CSV."""
    trends = selectors.hit_rate_trends(
        since=window.since, until=window.until, bucket=window.bucket, viewer=viewer
    )
    names = dict(viewer.templates(Template.objects.filter(pk__in=trends)).values_list("pk", "name"))
    found = sorted(
        (Series(names[pk], values) for pk, values in trends.items() if pk in names), key=lambda s: s.name
    )
    times = bucket_starts(window)
    if request.GET.get("format") == "csv":
        response = HttpResponse(traffic_series.as_csv(times, found), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="templates-hit-rate-{window.key}.csv"'
        return response
    table = [(at, [percent(s.values[i]) for s in found]) for i, at in enumerate(times)]
    return render(request, "dashboard/home.html#spark-numbers", {"spark_names": [s.name for s in found],
                                                                "spark_table": table})  # fmt: skip


def _next_sort(current: str, field: str) -> str:
    """A header's link: its field descending, or ascending when the list is sorted by it descending."""
    return field if current == f"-{field}" else f"-{field}"


def _aria_sort(current: str, field: str) -> str:
    if current.lstrip("-") != field:
        return "none"
    return "descending" if current.startswith("-") else "ascending"


@dataclass(frozen=True, slots=True)
class MarkedChart(Chart):
    """A chart with a vertical marker where each version in its window went live."""

    markers: tuple[dict[str, str], ...] = ()

    @property
    def data(self) -> dict[str, Any]:
        drawn: dict[str, Any] = Chart.data.fget(self)  # type: ignore[attr-defined]
        return drawn | {"markers": list(self.markers)}


@login_required
def template_detail(request: HtmxHttpRequest, template_id: int) -> HttpResponse:
    """A template's page over the window in the URL, one chart's CSV, or (htmx) one version's panel."""
    viewer = viewer_of(request.user)
    template = get_object_or_404(
        viewer.templates(Template.objects.select_related("repository")), pk=template_id
    )
    now = timezone.now()
    window = picked_window(request.GET, now=now)
    query = urlencode(window.params())
    versions = live_versions(template.pk)
    reads = _reads(template.pk, window, viewer)
    charts = template_charts(template, window, versions, reads, query=query)
    if request.GET.get("format") == "csv":
        return _chart_csv(template, charts, request.GET.get("chart", ""))
    picked = version_panel(
        template, picked_version(request.GET.get("version", ""), versions), now=now, viewer=viewer
    )
    context = {"template": template, "window": window, "windows": [*WINDOWS, "custom"], "charts": charts,
               "query": query, "versions": versions, "version": picked}  # fmt: skip
    if request.htmx and request.htmx.target == "version-panel":
        return render(request, "dashboard/template.html#version-panel", context)
    totals, lost_here, cost, memory = _figures(template.pk, window, reads, viewer)
    checks = check_rows(template.pk, versions, now=now, viewer=viewer)
    context |= {"totals": totals, "hit_rate": percent(totals.hit_rate), "lost": _lost_rows(lost_here),
                "lost_total": sum(lost_here.values()), "cost": cost, "memory": memory,
                "families": list(selectors.families_of(template.pk, viewer=viewer)[:50]),
                "regressions": list(selectors.regressions_of(template.pk, viewer=viewer)),
                "checks": checks, "checks_chart": ChecksChart(checks), "of_recorded": OF_RECORDED,
                "gateway_cache": GATEWAY_CACHE, "gateway_answers": selectors.gateway_cache_answers(
                    template_id=template.pk, since=window.since, until=window.until, viewer=viewer),
                **_killers(request, template, now=now, viewer=viewer)}  # fmt: skip
    return render(request, "dashboard/template.html", context)


@dataclass(frozen=True, slots=True)
class Reads:
    """The template's rollups over a window, each table read once (reads/templates.py)."""

    requests: TemplateRequests
    losses: dict[datetime | None, dict[str, int]]  # per bucket start, and at None in all


def _reads(template_id: int, window: Window, viewer: Viewer) -> Reads:
    asked: dict[str, Any] = {"template_id": template_id, "since": window.since, "until": window.until,
             "bucket": window.bucket, "viewer": viewer}  # fmt: skip
    return Reads(selectors.template_requests(ttft=window.ttft, **asked), selectors.template_losses(**asked))


def _figures(
    template_id: int, window: Window, reads: Reads, viewer: Viewer
) -> tuple[RequestSums, dict[str, int], Cost, list["MemoryRow"]]:
    """Its totals, lost tokens per cause, cost and prefix memory over the window: from the charts'
    reads when they read the table these read (hours when both ends are whole hours, else minutes),
    else read again. The cost is the template's over the window as every page prices it
    (app/diagnosis/cost.py)."""
    found = scope_cost(template_id=template_id, since=window.since, until=window.until, viewer=viewer)
    hours = all(at.minute == at.second == at.microsecond == 0 for at in (window.since, window.until))
    if hours == (window.bucket % 3600 == 0):
        lost = reads.losses.get(None, {})
        return reads.requests.totals, lost, found, prefix_memory(reads.requests.servers)
    span: dict[str, Any] = {"since": window.since, "until": window.until, "viewer": viewer}
    totals = selectors.template_totals(template_id=template_id, **span)
    lost = selectors.lost_by_template(template_id=template_id, **span).get(template_id, {})
    servers = selectors.totals_by_server(template_id=template_id, **span)
    return totals, lost, found, prefix_memory(servers)


def template_charts(
    template: Template, window: Window, versions: list[LiveVersion], reads: Reads, *, query: str
) -> list[MarkedChart]:
    """Hit rate, TTFT, lost tokens by cause and requests, as the series API reads a template
    (app/rollups/series.py), drawn from one read of each rollup."""
    times = traffic_series.bucket_starts(
        SeriesQuery("requests", "template", "", window.since, window.until, window.bucket)
    )
    buckets = reads.requests.buckets

    def line(value: Any, empty: float | None) -> list[float | None]:
        found = [buckets.get(at) for at in times]
        return [empty if sums is None else value(sums) for sums in found]

    def ttft(metric: str, q: float) -> Series:
        values = line(lambda b: sketch_quantile(q, b.ttft_sketch), None)
        return Series(f"{metric} ({window.ttft})", [None if v is None else float(v) for v in values])

    hit_rate = line(lambda b: b.cached_tokens / b.cache_known_prompt_tokens
                    if b.cache_known_prompt_tokens else None, None)  # fmt: skip
    lost = _lost_series(reads.losses, times)
    what = "as clients saw it (gateway, application)" if window.ttft == "client" else "as vLLM measured it"
    markers = tuple(_marker(v, template, query) for v in versions
                    if v.live_at is not None and window.since <= v.live_at < window.until)  # fmt: skip
    charts = [
        ("hit-rate", "Hit rate", OF_RECORDED, "ratio",
         [Series("hit_rate", hit_rate)]),
        ("ttft", "Time to first token", f"p50, p90 and p99, {what}", "seconds",
         [ttft("ttft_p50", 0.5), ttft("ttft_p90", 0.9), ttft("ttft_p99", 0.99)]),
        ("lost-tokens", "Prompt tokens lost, by cause", "Per bucket, from the diagnoses of its requests",
         "tokens", lost),
        ("requests", "Requests", "Per bucket", "count",
         [Series("requests", line(lambda b: float(b.requests), 0.0))]),
    ]  # fmt: skip
    return [
        MarkedChart(slug, title, note, unit, found, times, markers)
        for slug, title, note, unit, found in charts
    ]


def _lost_series(losses: dict[datetime | None, dict[str, int]], times: list[datetime]) -> list[Series]:
    """Prompt tokens lost per cause per bucket; the causes that lost nothing in the window left out."""
    found = []
    for cause in LOST_COLUMNS:
        values: list[float | None] = [float(losses.get(at, {}).get(cause, 0)) for at in times]
        if any(values):
            found.append(Series(cause, values))
    return found


def _marker(live: LiveVersion, template: Template, query: str) -> dict[str, str]:
    version = live.version
    assert live.live_at is not None
    href = reverse("dashboard:template-detail", args=[template.pk]) + f"?{query}&version={version.pk}"
    label = f"{version.commit_sha[:7]} live {live.live_at:%Y-%m-%d %H:%M} UTC ({live.source})"
    return {"at": live.live_at.isoformat(), "label": label, "href": href, "id": str(version.pk)}


def _chart_csv(template: Template, charts: list[MarkedChart], slug: str) -> HttpResponse:
    chart = next((c for c in charts if c.slug == slug), None)
    if chart is None:
        raise Http404("no such chart")
    response = HttpResponse(
        traffic_series.as_csv(chart.times, chart.series), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="template-{template.pk}-{slug}.csv"'
    return response


def _lost_rows(lost: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(((cause_label(c), t) for c, t in lost.items() if t), key=lambda pair: -pair[1])


@dataclass(frozen=True, slots=True)
class MemoryRow:
    server: Server
    prefix_tokens: int  # what its requests reused on average: hit rate x mean prompt tokens
    bytes_per_token: int | None  # None: the model's KV shape is not configured
    prefix_bytes: int | None


def prefix_memory(found: dict[int, RequestSums]) -> list[MemoryRow]:
    """Per server that served the template in the window (`found`: its totals there), the KV memory
    one copy of its reused prefix holds there: the tokens its requests reused on average, times the
    KV bytes per token of the server's model (PREFIXSCOPE_MODEL_KV_SHAPES, app/domain/kvmemory.py)."""
    servers = Server.objects.in_bulk(list(found))
    rows = []
    for server_id, totals in sorted(found.items(), key=lambda pair: servers[pair[0]].name):
        server = servers[server_id]
        tokens = round(totals.reused_per_request() or 0.0)
        shape = settings.PREFIXSCOPE_MODEL_KV_SHAPES.get(server.model)
        per_token = kv_bytes_per_token(shape) if shape else None
        rows.append(
            MemoryRow(server, tokens, per_token, kv_bytes_for_tokens(shape, tokens) if shape else None)
        )
    return rows


def _killers(
    request: HtmxHttpRequest, template: Template, *, now: datetime, viewer: Viewer
) -> dict[str, Any]:
    found, seen = visible_killers(list(template_killers(template.pk)), viewer=viewer)
    readable = may_read_prompts(request.user)
    samples = killer_samples(found, now=now, viewer=viewer) if readable else {}
    names = dict(viewer.servers(Server.objects.all()).values_list("pk", "name"))
    return {"killers": killer_rows(found, names, samples, seen=seen), "readable": readable,
            "latest": found[0] if found else None,
            "every": _interval(settings.PREFIXSCOPE_KILLER_EVERY_SECONDS)}  # fmt: skip


def _interval(seconds: int) -> str:
    """300 -> "5 minutes", 60 -> "minute", 90 -> "90 seconds": for "searched every ..."."""
    if seconds % 60:
        return f"{seconds} seconds"
    return "minute" if seconds == 60 else f"{seconds // 60} minutes"
