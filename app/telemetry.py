"""OpenTelemetry tracing of Prefixscope itself: off by default, on with the standard OTEL_* variables.

Tracing turns on when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) and `OTEL_SDK_DISABLED` is not true. Every process
calls `configure_tracing` once, after any fork (gunicorn post_fork, Celery worker_process_init,
manage.py for long-running commands); later calls do nothing.
"""

import logging
import os
from collections.abc import Mapping

logger = logging.getLogger(__name__)

_configured_pid: int | None = None


def tracing_enabled(environ: Mapping[str, str]) -> bool:
    """True when an OTLP endpoint is set and the SDK is not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure_tracing(service_name: str) -> bool:
    """Install the OTLP/HTTP exporter and instrument Django, Celery and psycopg.

    Returns True when this call turned tracing on. `OTEL_SERVICE_NAME` overrides `service_name`.
    """
    global _configured_pid
    if _configured_pid == os.getpid() or not tracing_enabled(os.environ):
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": service_name}).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    PsycopgInstrumentor().instrument(enable_commenter=False)
    _configured_pid = os.getpid()
    logger.info("tracing on", extra={"service_name": service_name})
    return True
