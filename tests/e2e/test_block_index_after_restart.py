"""The block index when the real vLLM CPU server restarts in place: the dead process's blocks leave it.

A new vLLM process numbers its KV event batches from 0 again and sends no AllBlocksCleared, so the
collector sees a new epoch and nothing else. The server here is this module's own, stopped and started
again on the same ports (the session's server must keep running for the other modules). Skipped, with
the reason, when vLLM is unavailable here.
"""

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from app.fleet.models import Server
from app.traffic.collection.kv_collector import KVEventCollector
from app.traffic.models import KVEvent, KVStream, ResidentBlock
from tests.support.captures import load_json
from tests.support.probes import Handshakes, post_json
from tests.support.vllm_cpu import VLLMServer, VLLMUnavailable, serve

pytestmark = [pytest.mark.vllm, pytest.mark.django_db, pytest.mark.timeout(1800)]
# Capture requests: before the restart they fill part of the 48-block cache, after it one other tenant's.
BEFORE = ("shared-prefix-I", "shared-prefix-the", "salt-a-1", "evict-0", "evict-1")
AFTER = ("salt-b-1",)


def start(stack: contextlib.ExitStack, **options: Any) -> VLLMServer:
    """Serve vLLM until `stack` closes; skip the test when vLLM is unavailable here."""
    try:
        return stack.enter_context(serve(**options))
    except VLLMUnavailable as exc:
        pytest.skip(f"vLLM CPU server unavailable: {exc.reason}")


def send(vllm: VLLMServer, names: tuple[str, ...]) -> None:
    for name in names:
        post_json(f"{vllm.base_url}/v1/completions", load_json(f"completion-{name}.json")["request"])


def collect_until_quiet(collector: KVEventCollector, quiet: float = 2.0, limit: float = 60.0) -> None:
    """Poll (each poll flushes) until no event has been stored for `quiet` seconds, at least one is."""
    deadline = time.monotonic() + limit
    stored, last_change = KVEvent.objects.count(), time.monotonic()
    while time.monotonic() < deadline:
        collector.poll(timeout_ms=100)
        if KVEvent.objects.count() != stored:
            stored, last_change = KVEvent.objects.count(), time.monotonic()
        elif stored and time.monotonic() - last_change >= quiet:
            return


def resident_blocks(server: Server) -> set[int | None]:
    return set(ResidentBlock.objects.filter(server=server).values_list("block_hash", flat=True))


def left_resident_by(server: Server, epoch: int) -> set[int | None]:
    """The blocks that `epoch`'s stored events alone leave resident, folded in stream order."""
    resident: set[int | None] = set()
    events = KVEvent.objects.filter(server=server, epoch=epoch).order_by("seq", "event_index", "block_index")
    for kind, block_hash in events.values_list("kind", "block_hash"):
        if kind == KVEvent.Kind.STORED:
            resident.add(block_hash)
        elif kind == KVEvent.Kind.REMOVED:
            resident.discard(block_hash)
        else:
            resident.clear()
    return resident


def test_after_a_restart_only_the_new_process_s_blocks_are_resident(tmp_path: Path) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    joins = Handshakes()
    collector = KVEventCollector(context, flush_seconds=0, before_connect=joins)
    try:
        with contextlib.ExitStack() as running:
            first = start(running, log_path=tmp_path / "vllm-1.log")
            server = Server.objects.create(
                name="vllm-cpu",
                base_url=first.base_url,
                kv_events_endpoint=first.kv_endpoint,
                kv_replay_endpoint=first.replay_endpoint,
                kv_topic=first.topic,
            )
            collector.subscribe([server])
            joins.wait(1, keep_alive=lambda: collector.poll(timeout_ms=100))
            send(first, BEFORE)
            collect_until_quiet(collector)
        left_by_the_dead_process = resident_blocks(server)
        with serve(restart_of=first, log_path=tmp_path / "vllm-2.log") as second:
            joins.wait(2, keep_alive=lambda: collector.poll(timeout_ms=100), what="rejoining")
            send(second, AFTER)
            collect_until_quiet(collector)
    finally:
        joins.close()
        collector.close()
        context.destroy(linger=0)

    assert KVStream.objects.get(server=server).epoch == 1
    assert left_by_the_dead_process and left_resident_by(server, epoch=1)
    stale = resident_blocks(server) - left_resident_by(server, epoch=1)
    assert not stale, (
        f"{len(stale)} of the dead process's {len(left_by_the_dead_process)} blocks still resident"
    )
    assert resident_blocks(server) == left_resident_by(server, epoch=1)
