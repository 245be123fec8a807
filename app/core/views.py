from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from app.core.runbooks import RUNBOOKS, runbooks_by_owner
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


@require_GET
def runbooks(request: HttpRequest) -> HttpResponse:
    """The list of runbooks, one per alert, by who the alert pages."""
    return render(request, "runbooks/index.html", {"groups": list(runbooks_by_owner())})


@require_GET
def runbook(request: HttpRequest, alert: str) -> HttpResponse:
    """Who an alert pages, what it needs, what it means, how to check it in Prefixscope, what to do."""
    if alert not in RUNBOOKS:
        raise Http404(f"no runbook {alert}")
    return render(request, f"runbooks/{alert}.html", {"runbook": RUNBOOKS[alert]})
