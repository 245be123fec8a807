"""The Tenants page: each tenant's hit rate and lost tokens, and the salt audit."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone

from app.core.http import HtmxHttpRequest
from app.core.tenancy import viewer_of
from app.dashboard.windows import WINDOWS, picked_window
from app.diagnosis.reads import unexpected_hits
from app.diagnosis.tenants import shared_unsalted_prefixes, tenant_audit


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
