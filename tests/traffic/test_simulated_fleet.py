"""Prefixscope's collectors against the simulated fleet: events, scrapes and cached tokens agree."""

import time

import httpx
import pytest
import zmq
from django.db.models import Sum

from app.fleet.models import Server
from app.fleet.services import register_server
from app.rollups.tasks import refresh_rollups
from app.traffic.collection.kv_collector import KVEventCollector
from app.traffic.models import KVEvent, KVGap, KVStream, ResidentBlock, ScrapeSample, ServerMinute
from app.traffic.tasks import scrape_server
from simulator.fleet import describe
from tests.support.captures import captured_traffic
from tests.support.simulated_fleet import local_config, running_fleet

pytestmark = pytest.mark.django_db


def hits_total(server: Server) -> float:
    latest = ScrapeSample.objects.filter(server=server, series__name="vllm:prefix_cache_hits_total")
    return float(latest.order_by("-scraped_at").values_list("value", flat=True)[0])


def test_collected_events_and_scrapes_agree_with_what_the_servers_answered() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with running_fleet([local_config(name="sim-a"), local_config(name="sim-b")]) as configs:
            servers = [register_server(**{k: str(v) for k, v in describe(c).items()}) for c in configs]
            collector = KVEventCollector(context, flush_seconds=0)
            collector.subscribe(servers)
            for server in servers:
                scrape_server(server.pk)
            before = {server.pk: hits_total(server) for server in servers}

            cached = {server.pk: 0 for server in servers}
            for number, (body, _) in enumerate(captured_traffic()):
                server = servers[number % 2]
                body = {**body, "stream": False}
                answer = httpx.post(server.base_url + "/v1/completions", json=body, timeout=10).json()
                cached[server.pk] += answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                collector.poll(timeout_ms=20)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and KVStream.objects.count() < 2:
                collector.poll(timeout_ms=50)
            for _ in range(10):
                collector.poll(timeout_ms=20)
            collector.flush()
            for server in servers:
                scrape_server(server.pk)
            collector.close()
    finally:
        context.destroy(linger=0)
    refresh_rollups()  # as beat runs it every minute, in the demo too

    for server in servers:
        # The minute rollup of its pulls and events: what the Fleet page reads.
        rolled = ServerMinute.objects.filter(server=server).aggregate(
            hits=Sum("prefix_hits"), ttft=Sum("ttft_count"), pulls=Sum("scrapes"), evictions=Sum("evictions")
        )
        served = sum(1 for number in range(len(captured_traffic())) if servers[number % 2] == server)
        assert (rolled["hits"], rolled["ttft"], rolled["pulls"]) == (cached[server.pk], served, 2)
        assert rolled["evictions"] == KVEvent.objects.filter(server=server, kind=KVEvent.Kind.REMOVED).count()
        assert hits_total(server) - before[server.pk] == cached[server.pk] > 0
        assert KVEvent.objects.filter(server=server, kind=KVEvent.Kind.STORED).exists()
        assert ResidentBlock.objects.filter(server=server).count() <= 47
        server.refresh_from_db()
        assert (server.block_size, server.hash_algo, server.state) == (32, "sha256_cbor", "active")
    # Batches sent before a subscription reached its publisher (ZMQ's slow joiner) came by replay.
    assert not KVGap.objects.filter(lost__gt=0).exists()
