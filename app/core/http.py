"""The request type of views that django-htmx's middleware runs for."""

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """An HttpRequest with ``htmx`` (HtmxMiddleware sets it on every request): for type checking."""

    htmx: HtmxDetails
