"""Prometheus' /metrics: the text exposition of Prefixscope's own state (collector.py), to a caller
sending the metrics token when one is set."""

import hmac

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from app.core.http import HtmxHttpRequest
from app.dashboard.metrics.collector import PrefixscopeCollector

_registry = CollectorRegistry()
_registry.register(PrefixscopeCollector())


@require_GET
@never_cache
def metrics(request: HtmxHttpRequest) -> HttpResponse:
    """Prometheus text exposition of Prefixscope's own state (collector.py); with
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
