"""Fetching /v1/models over real HTTP from a local server."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from collectors.metrics.client import ScrapeFailed
from collectors.models.client import fetch_models
from tests.support.captures import VLLM_CPU_FIXTURES

ANSWER = (VLLM_CPU_FIXTURES / "models.json").read_bytes()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = {"/v1/models": 200, "/broken/v1/models": 503}.get(self.path, 404)
        self.send_response(status)
        self.end_headers()
        self.wfile.write(ANSWER if status == 200 else b"nope")

    def log_message(self, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_model_list_is_returned_as_text(base_url: str) -> None:
    with httpx.Client() as client:
        assert fetch_models(client, f"{base_url}/v1/models", timeout_seconds=5) == ANSWER.decode()


@pytest.mark.parametrize(
    ("path", "retryable", "reason"),
    [("/broken/v1/models", True, "HTTP 503"), ("/models", False, "HTTP 404")],
)
def test_errors_say_whether_a_retry_can_help(base_url: str, path: str, retryable: bool, reason: str) -> None:
    with httpx.Client() as client, pytest.raises(ScrapeFailed) as failure:
        fetch_models(client, base_url + path, timeout_seconds=5)
    assert (failure.value.retryable, failure.value.reason) == (retryable, reason)
