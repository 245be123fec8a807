"""Requests through the gateway command, per server: every one stored, and the stored cached tokens add
up to the growth of the server's own hit counter between two stored scrapes.

Runs twice: against a simulated fleet of two servers, and against the session's real vLLM CPU server
(the `vllm` marker; skipped with the reason when vLLM is unavailable here). The gateway is
`manage.py gateway`, one process per server, as deployed; the scrapes are `traffic.scrape_server`.
The real server is the session's, shared with test_real_vllm.py, whose checks need its cache cold
(pytest-django runs this module first: database tests go before the others). So every request here
carries a cache salt of this run's own: no other request can hit the blocks it leaves, and vLLM evicts
them before any block freed after them, so later traffic meets the cache as if cold.
"""

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Sum

from app.fleet.models import Server
from app.fleet.services import register_server
from app.traffic.models import RequestRecord, Scrape, ScrapeSample
from app.traffic.tasks import scrape_server
from collectors.records import canonical_request_id
from tests.support.captures import captured_traffic
from tests.support.ports import unused_ports
from tests.support.processes import Command, database_url_for_tests
from tests.support.running_gateway import call
from tests.support.simulated_fleet import local_config, running_fleet

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(1800)]
HITS = "vllm:prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    base_url: str


@pytest.fixture(params=["fleet", pytest.param("real", marks=pytest.mark.vllm)])
def upstreams(request: pytest.FixtureRequest) -> Iterator[list[Upstream]]:
    """Two simulated servers, or the session's real vLLM server (asked for by name: only then started)."""
    if request.param == "real":
        yield [Upstream("vllm-cpu", request.getfixturevalue("real_vllm").base_url)]
        return
    with running_fleet([local_config(name="sim-a"), local_config(name="sim-b")]) as configs:
        yield [Upstream(config.name, config.base_url) for config in configs]


@pytest.fixture
def gateways(upstreams: list[Upstream], tmp_path: Path) -> Iterator[dict[str, tuple[Server, Command, str]]]:
    """Each upstream registered and fronted by its own `manage.py gateway`: name -> (server, command, url)."""
    running = {}
    try:
        for upstream in upstreams:
            server = register_server(name=upstream.name, base_url=upstream.base_url)
            (port,) = unused_ports(1)
            command = Command(
                database_url_for_tests(),
                tmp_path / f"{upstream.name}.log",
                "gateway",
                "--listen",
                f"127.0.0.1:{port}",
                "--upstream",
                upstream.base_url,
                "--server",
                upstream.name,
                "--spill-file",
                str(tmp_path / f"{upstream.name}.jsonl"),
                "--flush-seconds",
                "0.1",
            ).start()
            running[upstream.name] = (server, command, f"http://127.0.0.1:{port}")
            command.wait_listening(port)
        yield running
    finally:
        for _, command, _ in running.values():
            command.ensure_stopped()


def scraped_total(server: Server, name: str) -> float:
    """`name` summed over its series, as stored from the server's latest successful scrape."""
    scrape = Scrape.objects.filter(server=server, ok=True).latest("scraped_at")
    samples = ScrapeSample.objects.filter(server=server, scraped_at=scrape.scraped_at, series__name=name)
    return float(samples.aggregate(total=Sum("value"))["total"] or 0.0)


def scrape_when_settled(server: Server) -> dict[str, float]:
    """Scrape until two scrapes in a row agree: vLLM counts a finished request a moment after answering."""
    totals: dict[str, float] = {}
    for _ in range(100):
        scrape_server(server.pk)
        latest = {name: scraped_total(server, name) for name in (HITS, PROMPT_TOKENS)}
        if latest == totals:
            return latest
        totals = latest
        time.sleep(0.2)
    raise AssertionError(f"the counters of {server.name} never settled")


def send(gateway: str, body: dict[str, Any], *, stream: bool, salt: str) -> str:
    """One completion through the gateway, as an application sends it, its cache salt prefixed with
    `salt` (see the module's docstring); the canonical id of the one its answer names."""
    body = {k: v for k, v in body.items() if k not in ("return_token_ids", "stream", "stream_options")}
    body["cache_salt"] = f"{salt}-{body.get('cache_salt', '')}"
    answer = call(
        "POST",
        f"{gateway}/v1/completions",
        body={**body, "stream": stream},
        headers={"Content-Type": "application/json"},
    )
    assert answer.status == 200, answer.body
    first = answer.body.removeprefix(b"data: ").split(b"\n", 1)[0] if stream else answer.body
    return canonical_request_id(str(json.loads(first)["id"]))


def test_every_request_is_stored_and_cached_tokens_add_up_to_the_hit_counter(
    gateways: dict[str, tuple[Server, Command, str]],
) -> None:
    before = {name: scrape_when_settled(server) for name, (server, _, _) in gateways.items()}
    sent: dict[str, list[str]] = {name: [] for name in gateways}
    salt = f"gateway-records-{uuid.uuid4().hex}"
    for number, (body, _) in enumerate(captured_traffic() * 2):  # the second round hits what the first cached
        for name, (_, _, url) in gateways.items():
            sent[name].append(send(url, body, stream=number % 3 == 2, salt=salt))
    after = {name: scrape_when_settled(server) for name, (server, _, _) in gateways.items()}
    for _, command, _ in gateways.values():
        assert "dropped" in command.stop()  # SIGTERM drains the writer's queue into PostgreSQL

    for name, (server, _, _) in gateways.items():
        records = {r.request_id: r for r in RequestRecord.objects.filter(server=server)}
        assert sorted(records) == sorted(sent[name]), name  # each request once, nothing else
        assert all(r.cached_tokens is not None and r.prompt_tokens for r in records.values())
        assert all(r.client_ttft_seconds is not None and r.client_ttft_seconds > 0 for r in records.values())
        cached = sum(r.cached_tokens or 0 for r in records.values())
        assert cached == after[name][HITS] - before[name][HITS] > 0, name
        prompt = sum(r.prompt_tokens or 0 for r in records.values())
        assert prompt == after[name][PROMPT_TOKENS] - before[name][PROMPT_TOKENS], name
