"""The REST API: django-ninja, OpenAPI schema at /api/openapi.json, documentation at /api/docs."""

from django.db import InterfaceError, OperationalError
from ninja import NinjaAPI

from app.api.compare import router as compare_router
from app.api.diagnosis import router as diagnosis_router
from app.api.families import router as families_router
from app.api.ingest.rest import router as ingest_router
from app.api.regressions import router as regressions_router
from app.api.requests import router as requests_router
from app.api.series import router as series_router
from app.api.servers import router as servers_router
from app.api.templates import router as templates_router
from app.api.tokens import router as tokens_router
from app.core.middleware import database_unavailable

api = NinjaAPI(
    title="Prefixscope API",
    version="1",
    description="Explains the prefix-cache misses of a vLLM fleet. Ingest endpoints take an ingest token; "
    "the others a logged-in session or a personal API token (Set-up, Your API tokens: /setup/tokens/).",
    urls_namespace="api",
)
# django-ninja answers its views' exceptions itself (a 500, with a traceback in DEBUG): PostgreSQL
# being away, e.g. while an ingest token is checked, is a 503 here too.
api.add_exception_handler(OperationalError, database_unavailable)
api.add_exception_handler(InterfaceError, database_unavailable)
api.add_router("/v1", ingest_router)
api.add_router("/v1", compare_router)
api.add_router("/v1", templates_router)
api.add_router("/v1", families_router)
api.add_router("/v1", diagnosis_router)
api.add_router("/v1", requests_router)
api.add_router("/v1", regressions_router)
api.add_router("/v1", series_router)
api.add_router("/v1", servers_router)
api.add_router("/v1", tokens_router)
