"""A tiny OTLP/HTTP trace receiver: what a server exports to ``/v1/traces``, kept in memory for tests."""

from __future__ import annotations

import contextlib
import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

logger = logging.getLogger(__name__)


class OTLPReceiver:
    """Collects the spans of every protobuf ``ExportTraceServiceRequest`` POSTed to ``url``."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        host, port = server.server_address[:2]
        self.url = f"http://{host!s}:{port}/v1/traces"
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self._spans.extend(scope_spans.spans)

    def spans(self) -> list[Span]:
        """Every span received so far, in arrival order."""
        with self._lock:
            return list(self._spans)

    def wait_for(self, done: Callable[[list[Span]], bool], timeout: float) -> list[Span]:
        """Poll until ``done(spans)`` holds or ``timeout`` seconds pass; return the spans either way.

        Exporters send in batches (vLLM's every few seconds), so a test waits, with a bound.
        """
        deadline = time.monotonic() + timeout
        while not done(spans := self.spans()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return spans


def attributes(span: Span) -> dict[str, object]:
    """A span's attributes as plain Python values (string, bool, int or float)."""
    values: dict[str, object] = {}
    for item in span.attributes:
        kind = item.value.WhichOneof("value")
        values[item.key] = getattr(item.value, kind) if kind else None
    return values


@contextlib.contextmanager
def run_otlp_receiver() -> Iterator[OTLPReceiver]:
    """Serve an OTLPReceiver on a free loopback port in a background thread until the block exits."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    receiver = OTLPReceiver(server)
    server.receiver = receiver  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.receiver.add(request)  # type: ignore[attr-defined]
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("otlp receiver: " + format, *args)
