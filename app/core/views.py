from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from app.core.metrics import PrefixscopeCollector
from app.core.selectors import broker_problem, database_problem

_registry = CollectorRegistry()
_registry.register(PrefixscopeCollector())


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
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of Prefixscope's own state (see app/core/metrics.py)."""
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)
