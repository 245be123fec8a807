"""Miss causes of the real vLLM CPU server's traffic, checked against what its own KV events say.

Prompts of token ids of this run's own (so no other test's blocks meet them), through the gateway, the
server's KV events collected over ZMQ: a first prompt (cold), one sharing its first ten blocks (changed
at its own question), one with a token changed near the top (a timestamp), a salted tenant's with the
same tokens (salt), then unrelated prompts that fill the 47 usable blocks and the first prompt again
(evicted). Each cause is checked against the KV events themselves: what was stored and removed before
the request arrived.
"""

import random
import time
from datetime import datetime, timedelta

import pytest
import zmq
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.domain.blockhash import signed_block_hashes
from app.fleet.models import Server
from app.traffic.collection.kv_collector import KVEventCollector
from app.traffic.models import KVEvent, RequestDiagnosis
from app.traffic.services.requests import ingest_request_records
from tests.e2e.test_block_index_after_restart import collect_until_quiet
from tests.support.probes import Handshakes
from tests.support.running_gateway import KeptRecords, call, running_gateway, wait_for
from tests.support.vllm_cpu import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.django_db, pytest.mark.timeout(1800)]
SIZE = 32
rng = random.Random()  # a new run, new tokens: the session's server keeps what other tests sent
BASE = [rng.randrange(1000, 30_000) for _ in range(10 * SIZE)]


def tail(length: int = 40) -> list[int]:  # past a block: a question of its own
    return [rng.randrange(1000, 30_000) for _ in range(length)]


def stamped(tokens: list[int], at: int) -> list[int]:
    """The prompt with the token at `at` changed, as a timestamp near the top changes it."""
    return [*tokens[:at], (tokens[at] + 7) % 30_000 + 1000, *tokens[at + 1 :]]


def removed_before(server: Server, block: int, moment: datetime) -> bool:
    removed = KVEvent.objects.filter(server=server, kind=KVEvent.Kind.REMOVED, emitted_at__lt=moment)
    return removed.filter(block_hash=block & (2**64 - 1)).exists()


def stored_before(server: Server, block: int, moment: datetime) -> bool:
    stored = KVEvent.objects.filter(server=server, kind=KVEvent.Kind.STORED, emitted_at__lt=moment)
    return stored.filter(block_hash=block & (2**64 - 1)).exists()


def test_real_vllm_misses_get_the_causes_its_kv_events_show(real_vllm: VLLMServer) -> None:
    server = Server.objects.create(
        name="vllm-cpu",
        base_url=real_vllm.base_url,
        kv_events_endpoint=real_vllm.kv_endpoint,
        kv_replay_endpoint=real_vllm.replay_endpoint,
        kv_topic=real_vllm.topic,
        block_size=SIZE,
        model=real_vllm.model,
    )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    joins = Handshakes()
    collector = KVEventCollector(context, flush_seconds=0, before_connect=joins)
    recorder = KeptRecords()
    sent: list[tuple[str, list[int], str | None]] = [
        ("cold", BASE + tail(), None),
        ("question", BASE + tail(), None),
        ("timestamp", stamped(BASE + tail(), 3), None),
        ("salted", BASE + tail(), f"tenant-{rng.randrange(10**9)}"),
        *((f"filler-{n}", tail(15 * SIZE), None) for n in range(4)),  # 60 blocks through 47
        ("evicted", BASE + tail(), None),
    ]
    try:
        collector.subscribe([server])
        joins.wait(1, keep_alive=lambda: collector.poll(timeout_ms=100))
        with running_gateway(real_vllm.base_url, recorder) as gateway:
            for number, (name, tokens, salt) in enumerate(sent):
                body: dict[str, object] = {"model": real_vllm.model, "prompt": tokens, "max_tokens": 1}
                if salt:
                    body["cache_salt"] = salt
                headers = {
                    "Content-Type": "application/json",
                    "X-Request-Id": f"{name}-{rng.randrange(10**9)}",
                }
                assert call("POST", gateway + "/v1/completions", body, headers).status == 200
                wait_for(lambda: len(recorder.records) > number)  # noqa: B023 - called at once
                collect_until_quiet(collector, quiet=0.5, limit=10)
                time.sleep(0.05)  # the next arrival after this one's events
    finally:
        joins.close()
        collector.close()
        context.destroy(linger=0)
    ingest_request_records(recorder.records, source="gateway", now=timezone.now(), default_server="vllm-cpu")
    diagnose_requests(now=timezone.now() + timedelta(minutes=1))

    names = {facts.request_id: name for facts, (name, _, _) in zip(recorder.records, sent, strict=True)}
    found = {names[d.request_id]: d for d in RequestDiagnosis.objects.filter(server=server)}
    assert found["cold"].cause == "cold"
    assert (found["question"].cause, found["question"].diverged_at) == ("prompt_changed", 10 * SIZE)
    assert found["question"].reused_tokens == 10 * SIZE
    assert (found["timestamp"].cause, found["timestamp"].diverged_at) == ("prompt_changed", 3)
    assert found["salted"].cause == "salt" and found["salted"].salt_tokens == 10 * SIZE
    assert found["evicted"].cause == "evicted" and found["evicted"].reused_tokens < 10 * SIZE

    # What the server's own events say of each, at its arrival.
    base_first = signed_block_hashes(BASE, SIZE)[0]
    arrivals = {name: found[name].arrived_at for name in found}
    assert not stored_before(server, signed_block_hashes(stamped(BASE, 3), SIZE)[0], arrivals["timestamp"])
    assert stored_before(server, base_first, arrivals["salted"])  # the unsalted tokens were resident
    assert not removed_before(server, base_first, arrivals["salted"])
    lost = found["evicted"].reused_tokens // SIZE
    assert removed_before(server, signed_block_hashes(BASE, SIZE)[lost], arrivals["evicted"])
