"""What a KV-event publisher sent, read back from its replay endpoint, in the shape of stored KV event rows.

Counted on the publisher's side, independently of the collector: one row per block hash of a
BlockStored or BlockRemoved event, one per AllBlocksCleared, keyed by (seq, event index, block index).
"""

from collections import Counter
from collections.abc import Iterable

import zmq

from app.fleet.models import Server
from app.traffic.models import KVEvent, KVStream
from collectors.kv_events.client import fetch_replay
from collectors.kv_events.parse import BlockRemoved, BlockStored, ReplayReply

# (epoch, seq, event index, block index, kind, block hash as vLLM sends it)
Row = tuple[int, int, int, int, int, int | None]


def published(replay_endpoint: str) -> list[ReplayReply]:
    """Every batch the publisher still buffers, from seq 0 on (it must not have rolled over)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        replies = fetch_replay(context, replay_endpoint, 0, timeout_seconds=30.0)
    finally:
        context.destroy(linger=0)
    assert [reply.seq for reply in replies] == list(range(len(replies))), "the replay buffer rolled over"
    return replies


def all_stored(servers: Iterable[Server]) -> bool:
    """Whether the collector has stored every batch `servers` published (rank 0): each one's replay
    endpoint has nothing after the position the collector committed with its events, or nothing
    at all before its first. A quiet moment is no proof on a loaded machine: the collector may be
    between flushes, or the batch on its way."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    committed = dict(KVStream.objects.filter(dp_rank=0).values_list("server_id", "last_seq"))
    for server in servers:
        endpoint, after = server.kv_replay_endpoint, committed.get(server.pk, -1) + 1
        if endpoint and fetch_replay(context, endpoint, after, timeout_seconds=10):
            return False
    return True


def rows_of(replies: Iterable[ReplayReply], *, epoch: int = 0) -> list[Row]:
    rows: list[Row] = []
    for reply in replies:
        assert reply.batch is not None
        for index, event in enumerate(reply.batch.events):
            if isinstance(event, BlockStored | BlockRemoved):
                kind = KVEvent.Kind.STORED if isinstance(event, BlockStored) else KVEvent.Kind.REMOVED
                rows += [(epoch, reply.seq, index, i, kind, h) for i, h in enumerate(event.block_hashes)]
            else:
                rows.append((epoch, reply.seq, index, 0, KVEvent.Kind.CLEARED, None))
    return rows


def resident_after(replies: Iterable[ReplayReply]) -> set[int]:
    """The blocks the publisher holds after these batches: stored, minus removed, emptied by a clear."""
    resident: set[int] = set()
    for reply in replies:
        assert reply.batch is not None
        for event in reply.batch.events:
            if isinstance(event, BlockStored):
                resident.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                resident.difference_update(event.block_hashes)
            else:
                resident.clear()
    return resident


def differences(stored: Iterable[Row], expected: Iterable[Row]) -> dict[str, list[Row]]:
    """Rows expected but not stored, and rows stored more often than expected (a few of each)."""
    stored_counts, expected_counts = Counter(stored), Counter(expected)
    missing = sorted((expected_counts - stored_counts).elements(), key=repr)
    extra = sorted((stored_counts - expected_counts).elements(), key=repr)
    return {"missing": missing[:5], "extra": extra[:5]} if missing or extra else {}
