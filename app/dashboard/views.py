from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django_htmx.middleware import HtmxDetails

from app.dashboard.selectors import fleet_overview


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


@login_required
def home(request: HtmxHttpRequest) -> HttpResponse:
    """The fleet at a glance; htmx polls refresh only the #fleet-table partial."""
    template = "dashboard/home.html"
    if request.htmx:
        template += "#fleet-table"
    return render(request, template, {"rows": fleet_overview(now=timezone.now())})
