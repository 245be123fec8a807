from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from app.fleet.models import Server
from app.traffic.models import MetricSeries, MinuteRollup, ScrapeSample

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(User.objects.create_user("engineer"))
    return client


def test_the_fleet_page_asks_for_a_login(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_fleet_page_shows_each_servers_hit_rate_over_the_last_hour(signed_in: Client) -> None:
    busy = Server.objects.create(
        name="vllm-busy", base_url="http://a:8000", block_size=32, hash_algo="sha256_cbor"
    )
    Server.objects.create(name="vllm-idle", base_url="http://b:8000")
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=3)
    for offset, (prompt, cached) in enumerate([(400, 320), (600, 0)]):
        MinuteRollup.objects.create(
            server=busy, minute=minute - timedelta(minutes=offset), requests=2, prompt_tokens=prompt + 500,
            cache_known_prompt_tokens=prompt, cached_tokens=cached, ttft_count=0, ttft_sum_seconds=0,
            ttft_buckets=[0] * 23,
        )  # fmt: skip
    MinuteRollup.objects.create(  # older than the window: not counted
        server=busy, minute=minute - timedelta(hours=2), requests=50, prompt_tokens=1000,
        cache_known_prompt_tokens=1000, cached_tokens=1000, ttft_count=0, ttft_sum_seconds=0,
        ttft_buckets=[0] * 23,
    )  # fmt: skip

    html = signed_in.get("/").content.decode()

    busy_row = html[html.index("vllm-busy") : html.index("</tr>", html.index("vllm-busy"))]
    assert "32.0 %" in busy_row  # 320 cached of the 1,000 prompt tokens whose cached tokens are known
    assert ">4<" in busy_row  # requests in the hour
    idle_row = html[html.index("vllm-idle") : html.index("</tr>", html.index("vllm-idle"))]
    assert "—" in idle_row


def test_an_htmx_poll_gets_only_the_table(signed_in: Client) -> None:
    Server.objects.create(name="vllm-0", base_url="http://a:8000")
    response = signed_in.get("/", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="fleet-table"')
    assert "<html" not in html


def test_the_counter_hit_rate_comes_from_scraped_counters_across_a_restart(signed_in: Client) -> None:
    server = Server.objects.create(name="vllm-counted", base_url="http://c:8000")
    hits = MetricSeries.objects.create(
        server=server, name="vllm:prefix_cache_hits_total", labels={}, kind="counter"
    )
    queries = MetricSeries.objects.create(
        server=server, name="vllm:prefix_cache_queries_total", labels={}, kind="counter"
    )
    start = timezone.now() - timedelta(minutes=30)
    # queries 0 -> 1000, restart, 0 -> 600: 1,600 queried; hits 0 -> 400, restart, 0 -> 240: 640 hit.
    for minute, (q, h) in enumerate([(0, 0), (1000, 400), (200, 80), (600, 240)]):
        at = start + timedelta(minutes=minute)
        ScrapeSample.objects.create(server=server, series=queries, scraped_at=at, value=q)
        ScrapeSample.objects.create(server=server, series=hits, scraped_at=at, value=h)

    html = signed_in.get("/").content.decode()

    row = html[html.index("vllm-counted") : html.index("</tr>", html.index("vllm-counted"))]
    assert "40.0 %" in row  # 640 / 1,600
