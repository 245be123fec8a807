"""The Requests explorer page: request records filtered and paged newest first (app/traffic/explorer.py).

One view serves the page and, for htmx, its #request-rows partial (the table and its next-page link).
Every view is a URL: the filters are the query string, and the next-page link pins the window's end.
"""

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from app.core.http import HtmxHttpRequest
from app.core.tenancy import viewer_of
from app.domain.keyset import BadCursor
from app.traffic.explorer import (
    RequestFilterForm,
    RequestFilters,
    RequestPage,
    encoded,
    explore_requests,
)


@login_required
@require_GET
def requests_explorer(request: HtmxHttpRequest) -> HttpResponse:
    """The filter form and one page of matching requests; invalid filters or a cursor of other
    filters show the form with its errors and no rows (status 400)."""
    form = RequestFilterForm(request.GET, viewer=viewer_of(request.user))
    context: dict[str, object] = {"form": form, "page": None, "next_url": None, "first_url": None}
    if form.is_valid():
        filters = form.filters(now=timezone.now())
        try:
            after = form.after(filters)
        except BadCursor as exc:
            form.add_error("cursor", str(exc))
        else:
            page = explore_requests(filters, after=after)
            context |= _links(form, filters, page, paged=after is not None)
    if request.htmx:  # htmx swaps only 2xx answers: the errors replace the rows all the same
        return render(request, "dashboard/requests.html#request-rows", context)
    return render(request, "dashboard/requests.html", context, status=200 if form.is_valid() else 400)


def _links(
    form: RequestFilterForm, filters: RequestFilters, page: RequestPage, *, paged: bool
) -> dict[str, object]:
    base = reverse("dashboard:requests")
    pinned = form.pinned(filters)
    token = encoded(page.next, form, filters)
    return {
        "page": page,
        "since": filters.since,
        "until": filters.until,
        "next_url": f"{base}?{urlencode(pinned | {'cursor': token})}" if token else None,
        "first_url": f"{base}?{urlencode(pinned)}" if paged else None,
    }
