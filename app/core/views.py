from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from app.core.selectors import broker_problem, database_problem


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serving (liveness); checks nothing else."""
    return JsonResponse({"status": "ok"})


@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Ready when PostgreSQL and the broker are reachable; 503 names what is not."""
    problems = [p for p in (database_problem(), broker_problem()) if p]
    if problems:
        return JsonResponse({"status": "unavailable", "problems": problems}, status=503)
    return JsonResponse({"status": "ok"})


@require_GET
def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """/favicon.ico, which browsers ask for on pages that name no icon (the API docs, the admin)."""
    return HttpResponseRedirect(static("favicon.svg"))


# The runbook of each alert in deploy/prometheus/rules, by the slug its runbook_url ends with.
RUNBOOKS = {
    "prefix-cache-hit-rate-dropped": "PrefixCacheHitRateDropped",
    "prefix-cache-hit-rate-zero": "PrefixCacheHitRateZero",
    "kv-cache-saturated": "KVCacheSaturated",
    "vllm-metrics-down": "VLLMMetricsDown",
    "template-hit-rate-dropped": "TemplateHitRateDropped",
    "tenant-hit-rate-dropped": "TenantHitRateDropped",
    "server-below-peers": "ServerBelowPeers",
    "new-cache-killer": "NewCacheKiller",
    "reuse-expected-none-delivered": "ReuseExpectedNoneDelivered",
    "regression-open": "RegressionOpen",
    "eviction-thrashing": "EvictionThrashing",
    "eviction-spike": "EvictionSpike",
    "kv-event-batches-lost": "KVEventBatchesLost",
    "kv-event-gaps-recurring": "KVEventGapsRecurring",
    "kv-events-stalled": "KVEventsStalled",
    "server-scrapes-stale": "ServerScrapesStale",
    "server-scrapes-failing": "ServerScrapesFailing",
    "collector-silent": "CollectorSilent",
    "kv-stream-unleased": "KVStreamUnleased",
    "kv-leases-flapping": "KVLeasesFlapping",
    "collector-backlog": "CollectorBacklog",
    "gateway-spilled": "GatewaySpilled",
    "analysis-lagging": "AnalysisLagging",
    "input-rejected": "InputRejected",
    "prefixscope-metrics-absent": "PrefixscopeMetricsAbsent",
    "vllm-kv-blocks-evicted-young": "VLLMKVBlocksEvictedYoung",
    "vllm-kv-eviction-spike": "VLLMKVEvictionSpike",
    "vllm-server-below-peers": "VLLMServerBelowPeers",
}


@require_GET
def runbooks(request: HttpRequest) -> HttpResponse:
    """The list of runbooks, one per alert."""
    return render(request, "runbooks/index.html", {"runbooks": RUNBOOKS})


@require_GET
def runbook(request: HttpRequest, alert: str) -> HttpResponse:
    """What an alert means, how to check it in Prefixscope, and what to do."""
    if alert not in RUNBOOKS:
        raise Http404(f"no runbook {alert}")
    return render(request, f"runbooks/{alert}.html", {"alert": RUNBOOKS[alert]})
