"""The REST API: django-ninja, OpenAPI schema at /api/openapi.json, documentation at /api/docs."""

from functools import wraps
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, re_path
from ninja import NinjaAPI
from ninja.openapi.schema import OpenAPISchema
from ninja.parser import Parser

from app.api import openapi
from app.api.compare import router as compare_router
from app.api.diagnosis import router as diagnosis_router
from app.api.errors import UnsupportedMediaType, error_response, install_error_handlers
from app.api.families import router as families_router
from app.api.fleet import router as fleet_router
from app.api.ingest.rest import router as ingest_router
from app.api.regressions import router as regressions_router
from app.api.repositories import router as repositories_router
from app.api.requests import router as requests_router
from app.api.series import router as series_router
from app.api.servers import router as servers_router
from app.api.template_check import router as template_check_router
from app.api.template_traffic import router as template_traffic_router
from app.api.templates import router as templates_router
from app.api.tokens import router as tokens_router
from app.api.whatif import router as whatif_router
from app.core.middleware import database_unavailable


class JsonBodies(Parser):
    """django-ninja's JSON reader, refusing a body declared as another type (a form, plain text) with a
    415 rather than reading it as JSON anyway."""

    def parse_body(self, request: HttpRequest) -> Any:
        kind = request.content_type or ""
        if kind not in ("", "application/json") and not kind.endswith("+json"):
            raise UnsupportedMediaType(f"send the body as application/json, not {kind}")
        return super().parse_body(request)


class PrefixscopeAPI(NinjaAPI):
    """NinjaAPI whose every answer, even for a path or method it does not know, is JSON in the API's
    error shape, and whose schema documents those errors and the OTLP receiver."""

    def _get_urls(self) -> list[URLResolver | URLPattern]:
        urls = super()._get_urls()
        for pattern in urls:
            if isinstance(pattern, URLPattern):
                pattern.callback = _json_not_allowed(pattern.callback)
        return [*urls, re_path(r"^.*$", _no_such_path)]

    def get_openapi_schema(self, **kwargs: Any) -> OpenAPISchema:
        return openapi.completed(super().get_openapi_schema(**kwargs))


def _json_not_allowed(view: Any) -> Any:
    @wraps(view)  # keeps csrf_exempt: django-ninja checks CSRF itself, for session-authenticated calls
    def answer(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response: HttpResponse = view(request, *args, **kwargs)
        if response.status_code != 405 or response.get("Content-Type", "").startswith("application/json"):
            return response
        allowed = response.get("Allow", "")
        refused = error_response(405, f"{request.method} is not allowed here; allowed: {allowed}")
        refused["Allow"] = allowed
        return refused

    return answer


def _no_such_path(request: HttpRequest) -> HttpResponse:
    return error_response(404, f"no API operation at {request.path}")


api = PrefixscopeAPI(
    title="Prefixscope API",
    version="1",
    description="Explains the prefix-cache misses of a vLLM fleet. Ingest endpoints take an ingest token; "
    "the others a logged-in session or a personal API token (Set-up, Your API tokens: /setup/tokens/). "
    'Every error is JSON: `{"code": "...", "message": "...", "fields": {...}}`.',
    urls_namespace="api",
    parser=JsonBodies(),
)
install_error_handlers(api)
# django-ninja answers its views' exceptions itself (a 500, with a traceback in DEBUG): PostgreSQL
# being away, e.g. while an ingest token is checked, is a 503 here too.
api.add_exception_handler(OperationalError, database_unavailable)
api.add_exception_handler(InterfaceError, database_unavailable)
api.add_router("/v1", ingest_router)
api.add_router("/v1", compare_router)
api.add_router("/v1", repositories_router)
api.add_router("/v1", template_traffic_router)
api.add_router("/v1", template_check_router)
api.add_router("/v1", templates_router)
api.add_router("/v1", families_router)
api.add_router("/v1", diagnosis_router)
api.add_router("/v1", requests_router)
api.add_router("/v1", regressions_router)
api.add_router("/v1", series_router)
api.add_router("/v1", servers_router)
api.add_router("/v1", tokens_router)
api.add_router("/v1", fleet_router)
api.add_router("/v1", whatif_router)
