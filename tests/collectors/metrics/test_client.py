"""Fetching /metrics over real HTTP from a local server."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from collectors.metrics.client import ScrapeFailed, fetch_metrics
from tests.support.captures import VLLM_CPU_FIXTURES
from tests.support.ports import unused_port

PAGE = (VLLM_CPU_FIXTURES / "metrics-after.txt").read_bytes()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = {"/metrics": 200, "/broken": 503, "/missing": 404}.get(self.path, 404)
        if self.path == "/slow":
            threading.Event().wait(2)
            status = 200
        self.send_response(status)
        self.end_headers()
        self.wfile.write(PAGE if status == 200 else b"nope")

    def log_message(self, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_page_is_returned_as_text(base_url: str) -> None:
    with httpx.Client() as client:
        assert fetch_metrics(client, f"{base_url}/metrics", timeout_seconds=5) == PAGE.decode()


@pytest.mark.parametrize(
    ("path", "retryable", "reason"), [("/broken", True, "HTTP 503"), ("/missing", False, "HTTP 404")]
)
def test_errors_say_whether_a_retry_can_help(base_url: str, path: str, retryable: bool, reason: str) -> None:
    with httpx.Client() as client, pytest.raises(ScrapeFailed) as failure:
        fetch_metrics(client, base_url + path, timeout_seconds=5)
    assert (failure.value.retryable, failure.value.reason) == (retryable, reason)


def test_a_slow_server_times_out_retryably(base_url: str) -> None:
    with httpx.Client() as client, pytest.raises(ScrapeFailed, match="timed out") as failure:
        fetch_metrics(client, f"{base_url}/slow", timeout_seconds=0.2)
    assert failure.value.retryable


def test_nobody_listening_is_retryable() -> None:
    port = unused_port()
    with httpx.Client() as client, pytest.raises(ScrapeFailed) as failure:
        fetch_metrics(client, f"http://127.0.0.1:{port}/metrics", timeout_seconds=2)
    assert failure.value.retryable
