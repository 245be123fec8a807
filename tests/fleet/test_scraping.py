"""Pulling the real /metrics page over HTTP into scrapes, samples and the server's discovered settings."""

import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.utils import timezone

from app.fleet.models import Server
from app.fleet.services import claim_due_scrapes
from app.traffic.models import MetricSeries, Scrape, ScrapeSample
from app.traffic.tasks import scrape_server
from collectors.metrics.parse import parse_metrics
from tests.support.captures import VLLM_CPU_FIXTURES
from tests.support.factories import a_server
from tests.support.ports import unused_port

pytestmark = pytest.mark.django_db
PAGE = (VLLM_CPU_FIXTURES / "metrics-after.txt").read_bytes()


class MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def vllm_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), MetricsHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def closed_url() -> str:
    return f"http://127.0.0.1:{unused_port()}"


def test_a_scrape_stores_every_sample_and_discovers_the_cache_settings(vllm_url: str) -> None:
    server = Server.objects.create(name="vllm-cpu", base_url=vllm_url)

    scrape_server(server.pk)
    scrape_server(server.pk)

    server.refresh_from_db()
    assert (server.block_size, server.hash_algo, server.model, server.state) == (
        32,
        "sha256_cbor",
        "tiny",
        "active",
    )
    page_samples = len(parse_metrics(PAGE.decode()))
    assert (
        list(Scrape.objects.filter(server=server).values_list("ok", "sample_count"))
        == [(True, page_samples)] * 2
    )
    assert (
        MetricSeries.objects.filter(server=server).count() == page_samples
    )  # the second pull adds no series
    assert ScrapeSample.objects.filter(server=server).count() == 2 * page_samples
    hits = ScrapeSample.objects.get(
        server=server, series__name="vllm:prefix_cache_hits_total", scraped_at=server.last_scraped_at
    )
    assert hits.value == 960.0


def test_a_failed_scrape_marks_the_server_down_and_stores_no_values() -> None:
    server = Server.objects.create(
        name="vllm-gone", base_url=closed_url(), block_size=32, hash_algo="sha256_cbor"
    )

    scrape_server(server.pk)

    server.refresh_from_db()
    assert server.state == Server.State.DOWN
    assert (server.block_size, server.hash_algo) == (32, "sha256_cbor")  # what was discovered stays
    scrape = Scrape.objects.get(server=server)
    assert not scrape.ok and scrape.error
    assert not ScrapeSample.objects.filter(server=server).exists()


def test_a_down_server_that_answers_again_is_active(vllm_url: str) -> None:
    server = Server.objects.create(name="vllm-back", base_url=vllm_url, state=Server.State.DOWN)
    scrape_server(server.pk)
    server.refresh_from_db()
    assert server.state == Server.State.ACTIVE


def test_each_due_server_is_claimed_once_per_interval() -> None:
    now = timezone.now()
    every_15 = a_server(name="a", scrape_interval_seconds=15)
    a_server(name="off", state=Server.State.DISABLED)
    a_server(name="proposed", state=Server.State.PROPOSED)

    assert claim_due_scrapes(now=now) == [every_15]
    assert claim_due_scrapes(now=now + timedelta(seconds=5)) == []
    assert claim_due_scrapes(now=now + timedelta(seconds=15)) == [every_15]
