"""The KV-event subscriber against the real capture over real sockets: every event stored once."""

import time
from datetime import UTC, datetime

import msgspec
import pytest
import zmq
from django.db import connection

from app.fleet.models import Server
from app.traffic.collection.kv_collector import KVEventCollector, event_rows
from app.traffic.models import KVEvent, KVGap, KVStream, RejectedInput, ResidentBlock, UndecodableSample
from app.traffic.services.kv_events import KVEventRow
from collectors.kv_events.parse import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, decode_batch
from tests.support.fake_vllm_kv import FakeKVServer, captured_payloads, retime

pytestmark = pytest.mark.django_db
CAPTURED_ROWS = 95 + 44  # stored blocks plus removed blocks in the capture


@pytest.fixture
def server(vllm: FakeKVServer) -> Server:
    return Server.objects.create(
        name="vllm-cpu",
        base_url="http://127.0.0.1:18000",
        kv_events_endpoint=vllm.endpoint,
        kv_replay_endpoint=vllm.replay_endpoint,
        kv_topic="kv@127.0.0.1:18000@tiny",
    )


def start_collector(
    context: zmq.Context[zmq.Socket[bytes]], server: Server, vllm: FakeKVServer
) -> KVEventCollector:
    collector = KVEventCollector(context, flush_seconds=0)
    collector.subscribe([server])
    vllm.wait_for_subscriber()
    return collector


def run_until_stored(collector: KVEventCollector, rows: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while KVEvent.objects.count() < rows and time.monotonic() < deadline:
        collector.poll(timeout_ms=50)
    collector.flush()


def stored_keys() -> list[tuple[int, int, int, int]]:
    return list(KVEvent.objects.values_list("epoch", "seq", "event_index", "block_index"))


def test_the_live_stream_is_stored_with_its_block_index_and_position(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(context, server, vllm)
    for seq, payload in captured_payloads(shift_to=time.time()):
        vllm.publish(seq, payload)
    run_until_stored(collector, CAPTURED_ROWS)

    assert KVEvent.objects.count() == CAPTURED_ROWS
    assert KVStream.objects.get(server=server).last_seq == 23
    assert not KVGap.objects.exists()
    resident = ResidentBlock.objects.filter(server=server).count()
    assert 0 < resident <= 48  # the captured server had 48 blocks
    collector.close()


def test_a_forced_gap_is_replayed_and_recorded_with_nothing_lost(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(context, server, vllm)
    for seq, payload in captured_payloads(shift_to=time.time()):
        vllm.publish(seq, payload, send=seq not in (5, 6, 7))
    run_until_stored(collector, CAPTURED_ROWS)

    assert len(stored_keys()) == len(set(stored_keys())) == CAPTURED_ROWS
    gap = KVGap.objects.get(server=server)
    assert (gap.first_seq, gap.last_seq, gap.recovered, gap.lost) == (5, 7, 3, 0)
    collector.close()


def test_a_replay_answered_too_slowly_is_asked_again_and_nothing_is_lost(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    collector = KVEventCollector(context, flush_seconds=0, replay_timeout_seconds=0.3)
    collector.subscribe([server])
    vllm.wait_for_subscriber()
    vllm.replay_delays = [0.5]  # the first answer comes after the collector stopped waiting for it
    for seq, payload in captured_payloads(shift_to=time.time()):
        vllm.publish(seq, payload, send=seq not in (5, 6, 7))
    run_until_stored(collector, CAPTURED_ROWS)

    gap = KVGap.objects.get(server=server)
    assert (gap.first_seq, gap.last_seq, gap.recovered, gap.lost) == (5, 7, 3, 0)
    assert len(stored_keys()) == len(set(stored_keys())) == CAPTURED_ROWS
    collector.close()


def test_what_the_replay_buffer_no_longer_has_is_recorded_as_lost(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(context, server, vllm)
    payloads = captured_payloads(shift_to=time.time())
    for seq, payload in payloads[:5]:
        vllm.publish(seq, payload)
    vllm.buffer.clear()  # the server's replay buffer rolled over
    for seq, payload in payloads[7:]:
        vllm.publish(seq, payload)
    run_until_stored(collector, 1)
    time.sleep(0.2)
    run_until_stored(collector, CAPTURED_ROWS, timeout=1)

    gap = KVGap.objects.get(server=server)
    assert (gap.first_seq, gap.last_seq, gap.recovered, gap.lost) == (5, 6, 0, 2)
    collector.close()


def test_a_restarted_subscriber_catches_up_by_replay_and_stores_nothing_twice(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    payloads = captured_payloads(shift_to=time.time())
    first = start_collector(context, server, vllm)
    for seq, payload in payloads[:12]:
        vllm.publish(seq, payload)
    run_until_stored(first, 1)
    time.sleep(0.2)
    run_until_stored(first, CAPTURED_ROWS, timeout=1)
    first.close()
    stored_before = KVEvent.objects.count()
    assert KVStream.objects.get(server=server).last_seq == 11

    for seq, payload in payloads[12:]:  # published while no subscriber listens
        vllm.publish(seq, payload)
    second = KVEventCollector(context, flush_seconds=0)
    second.subscribe([server])  # resumes from seq 12 through the replay endpoint
    second.flush()

    assert 0 < stored_before < CAPTURED_ROWS
    assert len(stored_keys()) == len(set(stored_keys())) == CAPTURED_ROWS
    assert KVStream.objects.get(server=server).last_seq == 23
    second.close()


def test_a_restarted_vllm_opens_a_new_epoch(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(context, server, vllm)
    payloads = captured_payloads(shift_to=time.time() - 60)
    for seq, payload in payloads:
        vllm.publish(seq, payload)
    run_until_stored(collector, CAPTURED_ROWS)

    vllm.restart()  # numbering starts again from 0, with later batch times
    for seq, payload in payloads[:3]:
        vllm.publish(seq, retime(payload, 30))
    rows_of_first_three = KVEvent.objects.filter(epoch=0, seq__lt=3).count()
    run_until_stored(collector, CAPTURED_ROWS + rows_of_first_three)

    assert KVEvent.objects.filter(epoch=1).count() == rows_of_first_three
    stream = KVStream.objects.get(server=server)
    assert (stream.epoch, stream.last_seq) == (1, 2)
    collector.close()


def resident_in(epoch: int) -> set[int]:
    """The blocks that `epoch`'s stored events alone leave resident, folded in stream order."""
    resident: set[int] = set()
    for kind, block_hash in (
        KVEvent.objects.filter(epoch=epoch)
        .order_by("seq", "event_index", "block_index")
        .values_list("kind", "block_hash")
    ):
        if kind == KVEvent.Kind.STORED:
            resident.add(block_hash)
        elif kind == KVEvent.Kind.REMOVED:
            resident.discard(block_hash)
        else:
            resident.clear()
    return resident


def rows_in(payloads: list[tuple[int, bytes]]) -> int:
    """How many rows these batches make: one per block, one per clear."""
    events = [event for _, payload in payloads for event in msgspec.msgpack.decode(payload)[1]]
    return sum(len(event.get("block_hashes") or [None]) for event in events)


def receive(collector: KVEventCollector, rows: int, timeout: float = 10) -> None:
    """Poll until `rows` rows are stored or waiting in the collector's buffer."""
    deadline = time.monotonic() + timeout
    while KVEvent.objects.count() + len(collector.pending.rows) < rows and time.monotonic() < deadline:
        collector.poll(timeout_ms=50)


@pytest.mark.parametrize("flushed_in_between", [True, False], ids=["flushed", "one-flush"])
def test_a_restarted_vllm_s_blocks_are_the_only_ones_resident(  # type: ignore[no-untyped-def]
    context, server, vllm, flushed_in_between
) -> None:
    collector = start_collector(context, server, vllm)
    collector.flush_seconds = 3600  # written when the test says so
    payloads = captured_payloads(shift_to=time.time() - 60)
    for seq, payload in payloads:
        vllm.publish(seq, payload)
    receive(collector, CAPTURED_ROWS)
    if flushed_in_between:
        collector.flush()

    vllm.restart()  # a new process: numbering from 0, later batch times, and no AllBlocksCleared
    for seq, payload in payloads[:3]:
        vllm.publish(seq, retime(payload, 30))
    receive(collector, CAPTURED_ROWS + rows_in(payloads[:3]))
    collector.flush()

    assert KVEvent.objects.filter(epoch=1).count() == rows_in(payloads[:3])
    assert resident_in(0) - resident_in(1)  # the capture left blocks the first three batches did not store
    resident = set(ResidentBlock.objects.filter(server=server).values_list("block_hash", flat=True))
    assert resident == resident_in(1)
    collector.close()


def test_malformed_frames_are_counted_and_the_good_ones_around_them_kept(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(context, server, vllm)
    payloads = captured_payloads(shift_to=time.time())
    vllm.publish(*payloads[0])
    vllm.publisher.send_multipart([vllm.topic, (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
    broken_event = msgspec.msgpack.decode(payloads[1][1])
    broken_event[1].append({"type": "BlockStored", "block_hashes": ["not-a-hash"]})
    vllm.publish(1, msgspec.msgpack.encode(broken_event))
    run_until_stored(collector, 1)
    time.sleep(0.2)
    run_until_stored(collector, 10**6, timeout=0.5)

    assert set(KVEvent.objects.values_list("seq", flat=True)) == {0, 1}
    reasons = dict(RejectedInput.objects.filter(server=server).values_list("reason", "count"))
    assert reasons == {"kv_not_msgpack": 1, "kv_field_invalid": 1}, reasons
    samples = UndecodableSample.objects.filter(server=server)
    assert {(s.reason, bytes(s.head)[:3]) for s in samples} == {
        ("kv_not_msgpack", b"\xc1 n"),
        ("kv_field_invalid", b"\x82\xa4t"),
    }
    collector.close()


@pytest.mark.django_db(transaction=True)
def test_while_postgresql_is_away_events_wait_in_the_buffer_and_are_stored_after(context, vllm) -> None:  # type: ignore[no-untyped-def]
    server = Server.objects.create(
        name="vllm-cpu",
        base_url="http://127.0.0.1:18000",
        kv_events_endpoint=vllm.endpoint,
        kv_replay_endpoint=vllm.replay_endpoint,
        kv_topic="kv@127.0.0.1:18000@tiny",
    )
    collector = start_collector(context, server, vllm)
    for seq, payload in captured_payloads(shift_to=time.time()):
        vllm.publish(seq, payload)
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["HOST"] = "/nonexistent/postgresql"  # this process can no longer reach it
    try:
        deadline = time.monotonic() + 10
        while len(collector.pending.rows) < CAPTURED_ROWS and time.monotonic() < deadline:
            collector.poll(timeout_ms=50)
        assert collector.flush() == 0  # refused by the outage, kept for later
        assert len(collector.pending.rows) == CAPTURED_ROWS
    finally:
        connection.close()
        connection.settings_dict.update(saved)

    assert collector.flush() == CAPTURED_ROWS
    assert KVEvent.objects.count() == CAPTURED_ROWS and KVStream.objects.get().last_seq == 23
    collector.close()


def test_a_flush_the_database_refuses_is_counted_and_collecting_goes_on(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(context, server, vllm)
    payloads = captured_payloads(shift_to=time.time())
    long_ago = msgspec.msgpack.decode(payloads[0][1])
    long_ago[1] = long_ago[1][:1]  # one event of 5 blocks
    long_ago[0] = 978307200.0  # 2001: decodes, but no partition holds that day
    vllm.publish(0, msgspec.msgpack.encode(long_ago))
    deadline = time.monotonic() + 10
    while not RejectedInput.objects.exists() and time.monotonic() < deadline:
        collector.poll(timeout_ms=50)
    for seq, payload in payloads[1:]:
        vllm.publish(seq, payload)
    run_until_stored(collector, 1)

    assert KVEvent.objects.filter(seq=0).count() == 0 and KVEvent.objects.filter(seq=1).exists()
    refused = RejectedInput.objects.get(server=server)
    assert (refused.reason, refused.detail, refused.count) == (
        "not_storable",
        "refused by the database: IntegrityError",
        5,
    )
    collector.close()


def test_an_event_with_a_value_too_big_to_store_is_rejected_alone(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(context, server, vllm)
    payloads = captured_payloads(shift_to=time.time())
    batch = msgspec.msgpack.decode(payloads[0][1])
    batch[1] = [{**batch[1][0], "block_size": 2**15}, *batch[1]]  # a smallint column would refuse it
    vllm.publish(0, msgspec.msgpack.encode(batch))
    run_until_stored(collector, 1)

    good_blocks = sum(len(event["block_hashes"]) for event in batch[1][1:])
    assert KVEvent.objects.filter(seq=0).count() == good_blocks > 0
    refused = RejectedInput.objects.get(server=server)
    assert (refused.reason, refused.detail, refused.count) == (
        "kv_field_invalid",
        "BlockStored.block_size: expected an int from 0 to 32767",
        1,
    )
    collector.close()


def test_a_collector_with_no_kv_endpoint_to_listen_to_waits_out_its_polls(context) -> None:  # type: ignore[no-untyped-def]
    collector = KVEventCollector(context, flush_seconds=0)
    collector.subscribe([Server.objects.create(name="metrics-only", base_url="http://127.0.0.1:18000")])
    polls, cpu_before, until = 0, time.process_time(), time.monotonic() + 1.0
    while time.monotonic() < until:
        collector.poll(timeout_ms=100)
        polls += 1
    cpu_seconds = time.process_time() - cpu_before

    # Each poll waits its 100 ms (an empty zmq poller returned at once: millions of polls, a busy core).
    assert polls <= 11 and cpu_seconds < 0.2, (polls, cpu_seconds)
    collector.close()


def test_event_rows_are_one_per_block_with_its_parent_in_the_table_s_column_order() -> None:
    at = datetime(2026, 11, 29, 12, tzinfo=UTC)
    batch = EventBatch(
        ts=at.timestamp(),
        dp_rank=1,
        events=(
            BlockStored((7, 8), None, (1, 2, 3, 4), 2, None, "ada", "GPU", 0, None),
            BlockRemoved((7,), None, None),
            AllBlocksCleared("CPU"),
        ),
        rejected=(),
    )
    rows = event_rows(batch, server_id=3, epoch=2, seq=9, received_at=at)
    assert rows == [
        KVEventRow(3, 1, 2, 9, 0, 0, at, at, KVEvent.Kind.STORED, 7, None, 2, "GPU", "ada", 0),
        KVEventRow(3, 1, 2, 9, 0, 1, at, at, KVEvent.Kind.STORED, 8, 7, 2, "GPU", "ada", 0),
        KVEventRow(3, 1, 2, 9, 1, 0, at, at, KVEvent.Kind.REMOVED, 7, None, None, "", "", None),
        KVEventRow(3, 1, 2, 9, 2, 0, at, at, KVEvent.Kind.CLEARED, None, None, None, "CPU", "", None),
    ]
    assert all(type(row) is KVEventRow for row in rows)


def thrashes_in(payloads: list[tuple[int, bytes]], window: float) -> tuple[int, int, int]:
    """Blocks stored, removed and stored again within `window` seconds of their removal, counted
    straight from the decoded batches."""
    stored = removed = thrashed = 0
    removed_at: dict[int, float] = {}
    for _, payload in payloads:
        batch = decode_batch(payload)
        for event in batch.events:
            if isinstance(event, BlockStored):
                stored += len(event.block_hashes)
                for block_hash in event.block_hashes:
                    when = removed_at.pop(block_hash, None)
                    thrashed += when is not None and batch.ts - when <= window
            elif isinstance(event, BlockRemoved):
                removed += len(event.block_hashes)
                removed_at.update(dict.fromkeys(event.block_hashes, batch.ts))
    return stored, removed, thrashed


def test_blocks_stored_again_soon_after_their_eviction_are_counted_as_thrash(context, server, vllm) -> None:  # type: ignore[no-untyped-def]
    # The capture twice, the second time a minute later: what the first evicted, the second stores again.
    first = captured_payloads(shift_to=time.time() - 60)
    second = [(seq + len(first), payload) for seq, payload in captured_payloads(shift_to=time.time())]
    collector = start_collector(context, server, vllm)
    for seq, payload in first + second:
        vllm.publish(seq, payload)
    run_until_stored(collector, 2 * CAPTURED_ROWS)

    stream = KVStream.objects.get(server=server)
    expected = thrashes_in(first + second, window=300)
    assert expected[2] > 0
    assert (stream.blocks_stored, stream.blocks_removed, stream.blocks_thrashed) == expected
    collector.close()


def sglang_removed(block_hash: int, reason: str) -> dict[str, object]:
    """SGLang's BlockRemoved (issue #39604: block_hashes, medium) with PR #39620's removal reason."""
    return {"type": "BlockRemoved", "block_hashes": [block_hash], "medium": "GPU", "reason": reason}


def test_removal_reasons_are_stored_and_a_requests_freed_blocks_leave_the_cache_as_it_was(  # type: ignore[no-untyped-def]
    context, server, vllm
) -> None:
    """Over the sockets and the collector: each reason is stored with its row; a block a finished or
    aborted request freed stays in the block index (its cached copy stays) and is no eviction."""
    now = time.time()
    stored = {"type": "BlockStored", "block_hashes": [11, 12, 13, 14, 15], "parent_block_hash": None,
              "token_ids": list(range(10)), "block_size": 2, "lora_id": None, "medium": "GPU"}  # fmt: skip
    removals = [sglang_removed(11, "released"), sglang_removed(12, "aborted"), sglang_removed(13, "demoted"),
                sglang_removed(14, "evicted"), sglang_removed(15, "tier_migration")]  # fmt: skip
    collector = start_collector(context, server, vllm)
    vllm.publish(0, msgspec.msgpack.encode([now, [stored], 0]))
    vllm.publish(1, msgspec.msgpack.encode([now + 1, removals, 0]))
    run_until_stored(collector, 10)

    reasons = dict(
        KVEvent.objects.filter(kind=KVEvent.Kind.REMOVED).values_list("block_hash", "removal_reason")
    )
    assert reasons == {11: 3, 12: 4, 13: 2, 14: 1, 15: 0}  # app/domain/tiers.py RemovalReason
    assert set(ResidentBlock.objects.filter(server=server).values_list("block_hash", flat=True)) == {11, 12}
    stream = KVStream.objects.get(server=server)
    assert (stream.blocks_stored, stream.blocks_removed, stream.resident_blocks) == (5, 3, 2)
    collector.close()
