"""KV events delivered twice, malformed, or before the collector listened: each good event stored once.

Over real ZMQ sockets with the captured stream (tests/support/fake_vllm_kv.py), through the
collector as deployed (`manage.py collect_kv_events`) or, where only its logic matters, in process.
"""

import time
from pathlib import Path

import pytest
import zmq

from app.fleet.models import Server
from app.traffic.collection.kv_collector import KVEventCollector
from app.traffic.models import KVEvent, KVGap, KVStream, RejectedInput
from tests.support.fake_vllm_kv import FakeKVServer, captured_payloads
from tests.support.processes import Command, database_url_for_tests, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
CAPTURED_ROWS = 95 + 44  # stored blocks plus removed blocks in the capture


@pytest.fixture
def server(vllm: FakeKVServer) -> Server:
    return Server.objects.create(
        name="vllm-cpu",
        base_url="http://127.0.0.1:18000",
        kv_events_endpoint=vllm.endpoint,
        kv_replay_endpoint=vllm.replay_endpoint,
        kv_topic=vllm.topic.decode(),
    )


def stored_keys(server: Server) -> list[tuple[int, int, int, int]]:
    return list(
        KVEvent.objects.filter(server=server).values_list("epoch", "seq", "event_index", "block_index")
    )


def test_batches_published_before_the_first_subscription_are_fetched_by_replay(
    context: zmq.Context[zmq.Socket[bytes]], vllm: FakeKVServer, server: Server
) -> None:
    collector = KVEventCollector(context, flush_seconds=0)
    collector.subscribe([server])
    vllm.wait_for_subscriber()
    payloads = captured_payloads(shift_to=time.time())
    for seq, payload in payloads:
        vllm.publish(seq, payload, send=seq >= 5)  # 0-4 went by before the subscription reached vLLM
    deadline = time.monotonic() + 10
    while not KVStream.objects.filter(server=server, last_seq=23).exists() and time.monotonic() < deadline:
        collector.poll(timeout_ms=50)
    collector.close()

    assert len(stored_keys(server)) == len(set(stored_keys(server))) == CAPTURED_ROWS
    gap = KVGap.objects.get(server=server)
    assert (gap.epoch, gap.first_seq, gap.last_seq, gap.recovered, gap.lost) == (0, 0, 4, 5, 0)


def test_duplicated_and_malformed_deliveries_through_the_command_store_each_good_event_once(
    vllm: FakeKVServer, server: Server, tmp_path: Path
) -> None:
    collector = Command(
        database_url_for_tests(), tmp_path / "kv.log", "collect_kv_events", "--flush-seconds", "0.2"
    ).start()
    try:
        vllm.wait_for_subscriber(timeout_ms=60_000)
        for seq, payload in captured_payloads(shift_to=time.time()):
            if seq == 10:  # a corrupted delivery of batch 10, then the batch itself
                vllm.publisher.send_multipart([vllm.topic, seq.to_bytes(8, "big"), b"\xc1 not msgpack"])
                vllm.publisher.send_multipart([vllm.topic, seq.to_bytes(8, "big")])  # a frame short
            vllm.publish(seq, payload)
            vllm.publisher.send_multipart([vllm.topic, seq.to_bytes(8, "big"), payload])  # delivered twice
        wait_until(
            lambda: KVStream.objects.filter(server=server, last_seq=23).exists(),
            timeout=30,
            what="the last batch",
        )
        collector.stop()
    finally:
        collector.ensure_stopped()

    assert len(stored_keys(server)) == len(set(stored_keys(server))) == CAPTURED_ROWS
    assert not KVGap.objects.exists()  # a duplicate is not a gap, and a rejected frame moves nothing
    assert sum(RejectedInput.objects.filter(server=server).values_list("count", flat=True)) == 2
