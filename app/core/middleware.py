"""While PostgreSQL cannot be reached, every view answers 503 with Retry-After instead of a 500.

Senders (vLLM's OTLP exporter, scripts pushing REST batches, browsers) then know the failure is
temporary and when to try again; a 500 tells them their request was wrong, and in DEBUG it shows a
traceback. Views that handle the outage themselves keep their own answer.
"""

import logging
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5


def database_unavailable(request: HttpRequest, exc: object) -> HttpResponse:
    """The answer to a request that failed because PostgreSQL is away (`exc` says why, in the log)."""
    logger.warning("%s %s: database unavailable: %s", request.method, request.path, exc)
    # The REST API's error shape (app.api.errors), for scripts and browsers alike.
    body = {"code": "unavailable", "message": "the database is unavailable; retry later", "fields": {}}
    response = JsonResponse(body, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class DatabaseUnavailableMiddleware:
    """Turns a view's OperationalError or InterfaceError (PostgreSQL unreachable) into a 503."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, OperationalError | InterfaceError):
            return database_unavailable(request, exc)
        return None
