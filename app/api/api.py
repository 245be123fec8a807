"""The REST API: django-ninja, OpenAPI schema at /api/openapi.json, documentation at /api/docs."""

from ninja import NinjaAPI

from app.api.ingest import router as ingest_router

api = NinjaAPI(
    title="Prefixscope API",
    version="1",
    description="Explains the prefix-cache misses of a vLLM fleet. Ingest endpoints take an ingest token.",
    urls_namespace="api",
)
api.add_router("/v1", ingest_router)
api.add_router("/v1", "app.api.compare.router")
