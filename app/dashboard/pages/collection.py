"""The Collection page: whether every server is heard (pulls, KV event streams, gaps, refused input)."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render

from app.core.http import HtmxHttpRequest
from app.core.tenancy import viewer_of
from app.dashboard.reads.collection import collection_health


@login_required
def collection(request: HtmxHttpRequest) -> HttpResponse:
    """Whether every server is heard: pulls, KV event streams, gaps and refused input."""
    rows, reasons, gaps = collection_health(viewer=viewer_of(request.user))
    return render(request, "dashboard/collection.html", {"rows": rows, "reasons": reasons, "gaps": gaps})
