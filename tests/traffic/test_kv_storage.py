"""Storing the real captured KV events: once each, with the block index and stream positions."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import DataError, IntegrityError
from django.utils import timezone

from app.fleet.models import Server
from app.traffic.models import KVEvent, KVGap, KVStream, RejectedInput, ResidentBlock
from app.traffic.services.kv_events import GapRecord, KVEventRow, StreamPosition, store_kv_events
from app.traffic.services.rejections import count_rejected_input
from collectors.errors import RejectReason
from tests.support.captures import load_json

pytestmark = pytest.mark.django_db
KINDS = {"BlockStored": 1, "BlockRemoved": 2, "AllBlocksCleared": 3}


@pytest.fixture
def server() -> Server:
    return Server.objects.create(name="vllm-cpu", base_url="http://127.0.0.1:18000")


def captured_rows(server: Server, *, emitted_at: datetime) -> list[KVEventRow]:
    """The capture's events as rows; batch times are moved to today, where partitions exist."""
    rows = []
    for message in load_json("kv-live.decoded.json"):
        _, events, dp_rank = message["batch"]
        for event_index, event in enumerate(events):
            for block_index, block_hash in enumerate(event.get("block_hashes") or [None]):
                parent = (
                    event.get("parent_block_hash")
                    if block_index == 0
                    else event["block_hashes"][block_index - 1]
                )
                rows.append(
                    KVEventRow(
                        server.pk,
                        dp_rank or 0,
                        0,
                        message["seq"],
                        event_index,
                        block_index,
                        emitted_at + timedelta(milliseconds=message["seq"]),
                        emitted_at,
                        KINDS[event["type"]],
                        block_hash,
                        parent,
                        event.get("block_size") if event["type"] == "BlockStored" else None,
                        event.get("medium") or "",
                        event.get("lora_name") or "",
                        event.get("group_idx"),
                    )
                )
    return rows


def expected_resident(rows: list[KVEventRow]) -> set[int | None]:
    resident: set[int | None] = set()
    for row in rows:
        if row.kind == 1:
            resident.add(row.block_hash)
        elif row.kind == 2:
            resident.discard(row.block_hash)
        else:
            resident.clear()
    return resident


def test_captured_events_build_the_block_index_of_the_real_server(server: Server) -> None:
    rows = captured_rows(server, emitted_at=timezone.now())
    position = StreamPosition(server.pk, 0, 0, last_seq=23, last_event_at=rows[-1].emitted_at)

    assert store_kv_events(rows=rows, positions=[position]) == len(rows) == 95 + 44

    resident = set(ResidentBlock.objects.filter(server=server).values_list("block_hash", flat=True))
    assert resident == expected_resident(rows)
    assert any(
        block_hash is not None and block_hash >= 2**63 for block_hash in resident
    )  # unsigned hashes survive the bigint column
    assert KVStream.objects.get(server=server).last_seq == 23


def test_redelivered_events_change_nothing_not_even_the_block_index(server: Server) -> None:
    rows = captured_rows(server, emitted_at=timezone.now())
    position = StreamPosition(server.pk, 0, 0, last_seq=23, last_event_at=rows[-1].emitted_at)
    store_kv_events(rows=rows, positions=[position])
    before = set(ResidentBlock.objects.values_list("block_hash", flat=True))

    # The first batch again (it stores blocks that later batches removed): nothing new.
    first_batch = [row for row in rows if row.seq == 0]
    assert store_kv_events(rows=first_batch, positions=[replace(position, last_seq=0)]) == 0

    assert set(ResidentBlock.objects.values_list("block_hash", flat=True)) == before
    assert KVEvent.objects.filter(server=server).count() == len(rows)
    assert KVStream.objects.get(server=server).last_seq == 23  # positions never go back


def test_clearing_empties_the_block_index_of_that_rank_only(server: Server) -> None:
    now = timezone.now()
    stored = KVEventRow(server.pk, 0, 0, 1, 0, 0, now, now, 1, 2**64 - 1, None, 32, "GPU", "", 0)
    other_rank = stored._replace(dp_rank=1)
    cleared = KVEventRow(server.pk, 0, 0, 2, 0, 0, now, now, 3, None, None, None, "GPU", "", None)
    store_kv_events(rows=[stored, other_rank], positions=[])
    store_kv_events(rows=[cleared], positions=[])
    assert list(ResidentBlock.objects.values_list("dp_rank", "block_hash")) == [(1, 2**64 - 1)]


NOT_MSGPACK = RejectReason.KV_NOT_MSGPACK


def test_a_lower_tier_or_another_groups_copy_never_moves_the_gpu_block_index(server: Server) -> None:
    now = timezone.now()
    stored = KVEventRow(server.pk, 0, 0, 1, 0, 0, now, now, 1, 77, None, 32, "GPU", "", 0)
    cpu_copy = stored._replace(seq=2, medium="CPU", token_count=0)  # the offloading connector's copy
    other_group = stored._replace(seq=2, event_index=1, group_idx=1, block_hash=78)
    store_kv_events(rows=[stored, cpu_copy, other_group], positions=[])
    assert list(ResidentBlock.objects.values_list("block_hash", flat=True)) == [77]
    removed_there = [
        cpu_copy._replace(seq=3, kind=2),
        stored._replace(seq=3, event_index=1, kind=2, group_idx=1),
    ]
    cleared_there = stored._replace(seq=4, kind=3, block_hash=None, medium="CPU", group_idx=None)
    store_kv_events(rows=[*removed_there, cleared_there], positions=[])
    assert list(ResidentBlock.objects.values_list("block_hash", flat=True)) == [77]


def test_gaps_and_rejections_are_recorded_once_and_counted(server: Server) -> None:
    now = datetime(2026, 11, 29, 12, tzinfo=UTC)
    gap = GapRecord(server.pk, 0, 0, first_seq=5, last_seq=9, recovered=3, lost=2, detected_at=now)
    store_kv_events(rows=[], positions=[], gaps=[gap])
    store_kv_events(rows=[], positions=[], gaps=[gap])
    assert list(KVGap.objects.values_list("first_seq", "last_seq", "lost")) == [(5, 9, 2)]

    for _ in range(2):
        count_rejected_input(
            server_id=server.pk, source="kv_events", code=NOT_MSGPACK, detail="batch: x", count=3, now=now
        )
    count_rejected_input(
        server_id=None, source="kv_events", code=NOT_MSGPACK, detail="batch: x", count=1, now=now
    )
    counts = dict(RejectedInput.objects.values_list("server_id", "count"))
    assert counts == {server.pk: 6, None: 1}


def test_redelivered_rows_mixed_with_new_ones_store_and_index_only_the_new(server: Server) -> None:
    rows = captured_rows(server, emitted_at=timezone.now())
    last_seq = max(row.seq for row in rows)
    earlier = [row for row in rows if row.seq < last_seq]
    store_kv_events(rows=earlier, positions=[])

    # The first batch again (its blocks were removed since) with the last, new batch.
    mixed = [row for row in rows if row.seq == 0] + [row for row in rows if row.seq == last_seq]
    assert store_kv_events(rows=mixed, positions=[]) == len(rows) - len(earlier)

    assert KVEvent.objects.filter(server=server).count() == len(rows)
    resident = set(ResidentBlock.objects.filter(server=server).values_list("block_hash", flat=True))
    assert resident == expected_resident(rows)


def one_row(server: Server, **changes: Any) -> KVEventRow:
    now = timezone.now()
    return KVEventRow(server.pk, 0, 0, 1, 0, 0, now, now, 1, 5, None, 32, "GPU", "", 0)._replace(**changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"dp_rank": 2**15},
        {"epoch": 2**31},
        {"seq": 2**63},
        {"event_index": 2**15},
        {"block_index": -(2**31) - 1},
        {"token_count": 2**15},
        {"group_idx": 2**15},
    ],
)
def test_an_integer_too_big_for_its_column_is_refused_not_wrapped(
    server: Server, changes: dict[str, int]
) -> None:
    good = one_row(server, seq=0)
    with pytest.raises(DataError):
        store_kv_events(rows=[good, one_row(server, **changes)], positions=[])
    assert not KVEvent.objects.exists()


def test_an_event_of_more_blocks_than_a_smallint_numbers_is_stored_whole(server: Server) -> None:
    # One BlockStored of a 1M-token prompt in blocks of 16: 65,536 blocks, numbered from 0.
    rows = [one_row(server, block_index=i, block_hash=i + 1) for i in range(2**16)]
    assert store_kv_events(rows=rows, positions=[]) == 2**16
    assert KVEvent.objects.filter(server=server).order_by("-block_index")[0].block_index == 2**16 - 1


def test_rows_with_no_partition_for_their_time_are_refused_by_the_database(server: Server) -> None:
    long_ago = datetime(2001, 1, 1, tzinfo=UTC)
    with pytest.raises(IntegrityError):
        store_kv_events(rows=[one_row(server, emitted_at=long_ago)], positions=[])


@pytest.mark.django_db(transaction=True)
def test_rows_of_a_server_that_does_not_exist_are_refused(server: Server) -> None:
    gone = Server.objects.create(name="gone", base_url="http://127.0.0.1:18001")
    gone_id = gone.pk
    gone.delete()
    with pytest.raises(IntegrityError):
        store_kv_events(rows=[one_row(server), one_row(server)._replace(server_id=gone_id)], positions=[])
    assert not KVEvent.objects.exists() and not ResidentBlock.objects.exists()


def resident_counts(server: Server) -> tuple[dict[int, int], dict[int, int]]:
    """Per rank: the streams' kept counts, and a count of the block index itself."""
    kept = dict(KVStream.objects.filter(server=server).values_list("dp_rank", "resident_blocks"))
    counted: dict[int, int] = {}
    for rank in ResidentBlock.objects.filter(server=server).values_list("dp_rank", flat=True):
        counted[rank] = counted.get(rank, 0) + 1
    return {rank: n for rank, n in kept.items() if n}, counted


def test_each_stream_keeps_its_count_of_resident_blocks_batch_by_batch(server: Server) -> None:
    rows = captured_rows(server, emitted_at=timezone.now())
    batches = sorted({row.seq for row in rows})
    for seq in batches:  # as the collector flushes: each batch with its position
        batch = [row for row in rows if row.seq == seq]
        store_kv_events(rows=batch, positions=[StreamPosition(server.pk, 0, 0, seq, batch[-1].emitted_at)])
        kept, counted = resident_counts(server)
        assert kept == counted, f"after batch {seq}"
    assert kept == {0: len(expected_resident(rows))} and kept[0] > 0

    # Redelivered (blocks stored again, removed again), then a block stored again on top of the index.
    store_kv_events(rows=rows, positions=[StreamPosition(server.pk, 0, 0, batches[-1], rows[-1].emitted_at)])
    assert resident_counts(server)[0] == kept
    again = [row for row in rows if row.kind == 1 and row.block_hash in expected_resident(rows)][:1]
    again = [again[0]._replace(seq=batches[-1] + 1)]
    store_kv_events(
        rows=again, positions=[StreamPosition(server.pk, 0, 0, batches[-1] + 1, again[0].emitted_at)]
    )
    assert resident_counts(server)[0] == kept  # already resident: no new row


def test_a_clear_or_a_restart_brings_the_count_to_what_the_index_holds(server: Server) -> None:
    now = timezone.now()
    stored = [
        KVEventRow(server.pk, rank, 0, 1, 0, i, now, now, 1, 1000 * rank + i, None, 16, "GPU", "", 0)
        for rank in (0, 1)
        for i in range(3)
    ]
    positions = [StreamPosition(server.pk, rank, 0, 1, now) for rank in (0, 1)]
    store_kv_events(rows=stored, positions=positions)
    assert resident_counts(server) == ({0: 3, 1: 3}, {0: 3, 1: 3})

    cleared = KVEventRow(server.pk, 0, 0, 2, 0, 0, now, now, 3, None, None, None, "GPU", "", None)
    store_kv_events(rows=[cleared], positions=[StreamPosition(server.pk, 0, 0, 2, now)])
    assert resident_counts(server) == ({1: 3}, {1: 3})

    # Rank 1's server restarted: its first batch of the new epoch stores one block.
    restarted = stored[3]._replace(epoch=1, seq=0, block_hash=7)
    store_kv_events(rows=[restarted], positions=[StreamPosition(server.pk, 1, 1, 0, now)])
    assert resident_counts(server) == ({1: 1}, {1: 1})
