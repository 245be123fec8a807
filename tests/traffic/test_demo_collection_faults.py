"""The demo's two collection faults (simulator/scenarios/demo.yaml, sim-4 and sim-8) through the real
path: a simulated server's undecodable KV-event batches on its real ZMQ stream, rejected by the KV
collector under their fixed reason code while the events around them are stored; and clients that
bypass the real gateway, so that the engine's request counter grows while the gateway records nothing.
"""

import asyncio
from typing import Any

import httpx
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from app.fleet.services import register_server
from app.traffic.collection.kv_collector import KVEventCollector
from app.traffic.models import KVEvent, KVGap, KVStream, RejectedInput
from collectors.errors import RejectReason
from simulator.fleet import describe
from simulator.sender import run
from simulator.server import ServerConfig
from tests.simulator.test_scenario import scenario_data, versions_as_commits
from tests.support.processes import wait_until
from tests.support.running_gateway import KeptRecords, running_gateway
from tests.support.simulated_fleet import local_config, running_fleet

PROMPT = {"model": "tiny", "max_tokens": 4}


def complete(config: ServerConfig, prompt: str) -> int:
    """Send one completion; its prompt's full blocks."""
    answer = httpx.post(f"{config.base_url}/v1/completions", json={**PROMPT, "prompt": prompt}, timeout=10)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["usage"]["prompt_tokens"]) // config.block_size


@pytest.mark.django_db(transaction=True)
def test_a_newer_engines_batches_are_rejected_as_undecodable_and_the_events_around_them_stored() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    config = local_config(name="sim-4", block_size=16, cpu_blocks=256, cpu_reload=False)
    with running_fleet([config]):
        server = register_server(**{k: str(v) for k, v in describe(config).items()})
        collector = KVEventCollector(context, flush_seconds=0)
        collector.subscribe([server])
        try:
            before = joined_at(config, collector, server.pk)  # full blocks of batches 0..joined
            joined = len(before) - 1
            fault = httpx.post(f"{config.base_url}/_simulator/undecodable_kv_events", json={"batches": 3})
            assert fault.json() == {"batches": 3}  # batches joined+1 to joined+3
            last = complete(config, "My invoice shows a charge twice this month. " * 4)  # joined+4

            def collected() -> bool:
                collector.poll(timeout_ms=50)
                return KVStream.objects.filter(server=server, last_seq=joined + 4).exists()

            wait_until(collected, timeout=20, what=f"batch {joined + 4}")
            collector.flush()
        finally:
            collector.close()
            context.destroy(linger=0)

    stored = KVEvent.objects.filter(server=server, kind=KVEvent.Kind.STORED)
    # The good batches on each side, whole: those before the subscription joined came by replay.
    assert set(stored.values_list("seq", flat=True)) == {*range(joined + 1), joined + 4}
    assert all(stored.filter(seq=seq).count() >= blocks > 0 for seq, blocks in enumerate(before))
    assert stored.filter(seq=joined + 4).count() >= last > 0
    rejected = RejectedInput.objects.get(server=server, source="kv_events")
    assert (rejected.reason, rejected.count) == (RejectReason.KV_FIELD_INVALID, 3)
    assert "block_hashes" in rejected.detail
    # Numbered in the sequence, the undecodable batches are no gap. Batches sent before the
    # subscription joined are one (seq 0 up to the first seen), replayed whole.
    gaps = KVGap.objects.filter(server=server)
    assert all(gap.last_seq < joined and gap.lost == 0 for gap in gaps), list(gaps)


def joined_at(config: ServerConfig, collector: KVEventCollector, server_id: int) -> list[int]:
    """Send distinct prompts until the collector's subscription has joined the publisher (ZMQ's
    slow joiner drops what is published before; on a loaded machine the join can outlast several
    requests), then until it holds all of them; each one's full blocks. Each request is one batch,
    and request n of a fresh server is seq n."""
    sent: list[int] = []

    def arrived() -> bool:
        sent.append(complete(config, f"The router's lights blink amber after update {len(sent)}. " * 4))
        collector.poll(timeout_ms=100)
        return (server_id, 0) in collector.streams

    def caught_up() -> bool:
        collector.poll(timeout_ms=50)
        return collector.streams[(server_id, 0)].last_seq == len(sent) - 1

    wait_until(arrived, timeout=20, what="the subscription to join")
    wait_until(caught_up, timeout=20, what=f"batch {len(sent) - 1}")
    return sent


def bypassing_scenario(bypass_from: float) -> dict[str, Any]:
    """One routed server of little traffic, and a side server whose clients bypass its gateway."""
    return scenario_data() | {
        "duration": 20, "rate": 0.01, "servers": {"count": 1, "block_size": 16, "num_blocks": 64},
        "side_servers": [{"rate": 2, "gateway_bypass_from": bypass_from}],
    }  # fmt: skip


def engine_requests(config: ServerConfig) -> float:
    """The engine's own counter of finished requests, as Prefixscope's scrape reads it."""
    text = httpx.get(f"{config.base_url}/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
    )


@pytest.mark.parametrize("later_round", [False, True])
def test_clients_that_bypass_the_gateway_are_served_and_not_recorded(later_round: bool) -> None:
    """From `gateway_bypass_from` on (from the start in a later round: the client stays misconfigured)
    the side server's requests reach the engine past the gateway: served, counted by the engine, and
    not recorded; before it they go through the gateway and are."""
    scenario, commits = versions_as_commits(bypassing_scenario(bypass_from=10))
    routed, side = local_config(name="sim-0"), local_config(name="sim-1")
    recorder = KeptRecords()
    with running_fleet([routed, side]), running_gateway(side.base_url, recorder) as gateway:
        summary = asyncio.run(
            run(scenario, [routed.base_url, gateway], speed=0, commits=commits, seed=3,
                direct_urls=[routed.base_url, side.base_url], later_round=later_round)
        )  # fmt: skip
        served = engine_requests(side)

    sent = [result for result in summary.results if result.server == 1]
    assert sent and all(result.error is None for result in sent)
    through_gateway = [r.request_id for r in sent if r.at < 10 and not later_round]
    assert 0 < len(through_gateway) < len(sent) or (later_round and not through_gateway)
    assert sorted(record.request_id for record in recorder.records) == sorted(through_gateway)
    assert served == len(sent)
