"""Tracing of Prefixscope itself: off by default, on with OTEL_* variables, spans over OTLP/HTTP."""

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from app.telemetry import tracing_enabled

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("environ", "enabled"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_on_only_with_an_endpoint_and_not_disabled(environ: dict[str, str], enabled: bool) -> None:
    assert tracing_enabled(environ) is enabled


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[str, list[bytes]]]:
    """A local OTLP/HTTP endpoint that keeps every export request body."""
    bodies: list[bytes] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            """Keep the test output quiet."""

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", bodies
    server.shutdown()


SCRIPT = """
import django
django.setup()
from app.telemetry import configure_tracing
assert configure_tracing("prefixscope-test")
assert not configure_tracing("prefixscope-test"), "a second call must do nothing"
from django.test import Client
assert Client().get("/healthz").status_code == 200
from opentelemetry import trace
trace.get_tracer_provider().force_flush()
"""


def test_a_configured_process_exports_django_request_spans(otlp_receiver: tuple[str, list[bytes]]) -> None:
    endpoint, bodies = otlp_receiver
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "DJANGO_SETTINGS_MODULE": "app.settings",
        "DJANGO_ALLOWED_HOSTS": "testserver",
    }
    env.pop("OTEL_SDK_DISABLED", None)
    subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, check=True, timeout=120)

    spans = []
    for body in bodies:
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                spans += [(attributes["service.name"], span.name) for span in scope_spans.spans]
    assert ("prefixscope-test", "GET healthz") in spans
