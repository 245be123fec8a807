from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django_htmx.middleware import HtmxDetails

from app.dashboard.selectors import collection_health, fleet_overview


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


@login_required
def home(request: HtmxHttpRequest) -> HttpResponse:
    """The fleet at a glance; htmx polls refresh only the #fleet-table partial."""
    template = "dashboard/home.html"
    if request.htmx:
        template += "#fleet-table"
    return render(request, template, {"rows": fleet_overview(now=timezone.now())})


@login_required
def collection(request: HtmxHttpRequest) -> HttpResponse:
    """Whether every server is heard: pulls, KV event streams, gaps and refused input."""
    rows, reasons, gaps = collection_health()
    return render(request, "dashboard/collection.html", {"rows": rows, "reasons": reasons, "gaps": gaps})
