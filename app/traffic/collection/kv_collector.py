"""The KV-event subscriber: one ZMQ poller for the event streams of the servers this process leases
(app/traffic/collection/kv_leases.py: several processes share a fleet).

Each batch is checked against the stream's sequence: a gap is asked of the server's replay
endpoint, what it cannot send back is recorded as lost; a sequence that starts over means the
server restarted and opens a new epoch. Rows are buffered and written with COPY every
`flush_seconds` together with the stream positions, so a restarted subscriber resumes from
the last committed position (replaying what it missed) and stores nothing twice.
"""

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import zmq
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError

from app.domain.thrash import RecentRemovals
from app.domain.tiers import RemovalReason, attention_group, is_pressure
from app.fleet.models import Server, kv_group_kinds
from app.fleet.services import KVCacheGroups, record_kv_cache_groups
from app.traffic.models import KVEvent, KVStream
from app.traffic.services.kv_events import (
    GapRecord,
    KVEventRow,
    StreamCounts,
    StreamPosition,
    store_kv_events,
)
from app.traffic.services.rejections import Sample, count_rejected_input, keep_undecodable_samples
from collectors.errors import Rejection, RejectReason
from collectors.kv_events.client import KVTransportError, fetch_replay, open_subscriber
from collectors.kv_events.parse import (
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVDecodeError,
    ReplayReply,
    decode_sub_message,
)
from collectors.kv_events.parse import RemovalReason as WireReason
from collectors.kv_events.sequence import Duplicate, Gap, Restart, SequenceState, observe_seq

logger = logging.getLogger(__name__)

SOURCE = "kv_events"
MAX_PENDING_ROWS = 500_000
PRUNE_SECONDS = 30.0


@dataclass(slots=True)
class Pending:
    rows: list[KVEventRow] = field(default_factory=list)
    positions: dict[tuple[int, int], StreamPosition] = field(default_factory=dict)
    gaps: list[GapRecord] = field(default_factory=list)
    rejected: dict[tuple[int, Rejection], int] = field(default_factory=dict)  # (server id, why) -> count
    samples: list[Sample] = field(default_factory=list)  # the first bytes of undecodable input
    # (server id, rank) -> [blocks stored, removed, stored again soon after removal]
    counts: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    groups: dict[int, KVCacheGroups] = field(default_factory=dict)  # server id -> its groups, when changed

    def __bool__(self) -> bool:
        return bool(self.rows or self.positions or self.gaps or self.rejected or self.groups)


def event_rows(
    batch: EventBatch, *, server_id: int, epoch: int, seq: int, received_at: datetime
) -> list[KVEventRow]:
    """One row per block of every decoded event of a batch (one row for a clear)."""
    emitted_at = datetime.fromtimestamp(batch.ts, tz=UTC)
    head = (server_id, batch.dp_rank or 0, epoch, seq)
    new = tuple.__new__  # new(KVEventRow, values): no call of the named tuple's Python-level __new__
    rows: list[KVEventRow] = []
    for index, event in enumerate(batch.events):
        at, medium = (*head, index), event.medium or ""
        if isinstance(event, BlockStored):
            tail: tuple[object, ...] = (
                event.block_size,
                medium,
                event.lora_name or "",
                event.group_idx,
                None,
            )
            parents = (event.parent_block_hash, *event.block_hashes[:-1])
            rows += [
                new(KVEventRow, (*at, i, emitted_at, received_at, _STORED, block_hash, parent, *tail))
                for i, (block_hash, parent) in enumerate(zip(event.block_hashes, parents, strict=True))
            ]
        elif isinstance(event, BlockRemoved):
            reason = None if event.reason is None else _REASONS[event.reason]
            tail = (None, None, medium, "", event.group_idx, reason)
            rows += [
                new(KVEventRow, (*at, i, emitted_at, received_at, _REMOVED, block_hash, *tail))
                for i, block_hash in enumerate(event.block_hashes)
            ]
        else:
            tail = (None, None, None, medium, "", None, None)
            rows.append(new(KVEventRow, (*at, 0, emitted_at, received_at, _CLEARED, *tail)))
    return rows


_STORED, _REMOVED, _CLEARED = KVEvent.Kind.STORED, KVEvent.Kind.REMOVED, KVEvent.Kind.CLEARED
_REASONS = {wire: int(RemovalReason[wire.name]) for wire in WireReason}  # the wire's name -> its code


def _is_pressure(event: BlockRemoved) -> bool:
    return is_pressure(None if event.reason is None else _REASONS[event.reason])


class KVEventCollector:
    """Subscribes to the servers it is given (those this process leases) and stores what arrives."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        *,
        flush_seconds: float = 0.5,
        replay_timeout_seconds: float = 2.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        before_connect: Callable[[zmq.Socket[bytes]], None] | None = None,
    ) -> None:
        self.context = context
        self.before_connect = before_connect  # open_subscriber's: for a caller that watches the joins
        self.flush_seconds = flush_seconds
        self.replay_timeout_seconds = replay_timeout_seconds
        self.now = now
        self.poller = zmq.Poller()
        self.servers: dict[zmq.Socket[bytes], Server] = {}
        self.streams: dict[tuple[int, int], SequenceState] = {}
        self.pending = Pending()
        self.last_flush = time.monotonic()
        self.removals: dict[tuple[int, int], RecentRemovals] = {}
        self.pruned_at = time.time()
        self.groups: dict[int, KVCacheGroups] = {}  # server id -> the KV-cache groups its events named

    def subscribe(self, servers: Iterable[Server]) -> None:
        """Connect to servers not yet subscribed, then catch up on what they published meanwhile."""
        known = {s.pk for s in self.servers.values()}
        for server in servers:
            if server.pk in known or not server.kv_events_endpoint:
                continue
            try:
                endpoint, topic = server.kv_events_endpoint, server.kv_topic
                socket = open_subscriber(self.context, endpoint, topic, before_connect=self.before_connect)
            except KVTransportError as exc:
                logger.warning("cannot subscribe to %s: %s", server.name, exc)
                continue
            self.servers[socket] = server
            self.groups[server.pk] = dict(server.kv_cache_groups)
            self.poller.register(socket, zmq.POLLIN)
            self._resume(server)

    def subscribed(self) -> set[int]:
        """The ids of the servers subscribed to."""
        return {server.pk for server in self.servers.values()}

    def unsubscribe(self, server_ids: set[int]) -> bool:
        """Stop collecting these servers once what came from them is stored; False (and nothing
        stopped) while it cannot be: another process taking them over resumes from the stored
        positions, and what it replays from there is what this one received and did not store."""
        self.flush()
        if self.pending:
            return False
        for socket, server in list(self.servers.items()):
            if server.pk in server_ids:
                self.poller.unregister(socket)
                socket.close(linger=0)
                del self.servers[socket]
        # Taken again later, a stream starts over from its stored position, not from this memory.
        self.streams = {key: state for key, state in self.streams.items() if key[0] not in server_ids}
        return True

    def _resume(self, server: Server) -> None:
        """Prime the trackers from committed positions and replay what came after them."""
        for stream in KVStream.objects.filter(server=server):
            self.streams[(server.pk, stream.dp_rank)] = SequenceState(
                epoch=stream.epoch, last_seq=stream.last_seq, newest_ts=stream.last_event_at.timestamp()
            )
            replayed = self._replay(server, stream.dp_rank, first=stream.last_seq + 1, last=None)
            logger.info(
                "%s rank %d: resumed after seq %d of epoch %d, %d batches replayed",
                server.name, stream.dp_rank, stream.last_seq, stream.epoch, replayed,
            )  # fmt: skip

    def poll(self, timeout_ms: int = 200) -> None:
        """Handle every message that arrives within `timeout_ms`, and flush when due."""
        if len(self.pending.rows) >= MAX_PENDING_ROWS:
            # PostgreSQL is away and the buffer is full: stop reading. What the sockets then drop
            # shows up as a sequence gap and is asked of the replay endpoint once writes resume.
            time.sleep(timeout_ms / 1000)
            self.flush()
            return
        if not self.servers:
            # zmq's Poller.poll returns at once when no socket is registered: an idle collector spun on
            # it, about 2 million times a second (half a core). Wait out the timeout instead.
            time.sleep(timeout_ms / 1000)
        for socket, _ in self.poller.poll(timeout_ms):
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle(self.servers[socket], frames)
        if time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def handle(self, server: Server, frames: list[bytes]) -> None:
        """Decode one SUB message and buffer its rows, mending gaps and restarts first."""
        try:
            message = decode_sub_message(frames)
        except KVDecodeError as exc:
            self._reject(server, Rejection(exc.code, exc.reason), 1, head=exc.head)
            return
        key = (server.pk, message.batch.dp_rank or 0)
        first_sight = key not in self.streams
        state, verdict = observe_seq(self.streams.get(key), message.seq, message.batch.ts)
        if isinstance(verdict, Duplicate):
            return
        self.streams[key] = state
        if isinstance(verdict, Restart):
            logger.info("%s restarted its KV event sequence: epoch %d", server.name, state.epoch)
        if (first_sight or isinstance(verdict, Restart)) and message.seq > 0:
            # Batches 0..seq-1 went by before our subscription reached the publisher (ZMQ's slow
            # joiner) or while we reconnected to a new process: fetch them, record what is gone.
            self._replay(server, key[1], first=0, last=message.seq - 1)
        if isinstance(verdict, Gap):
            self._replay(server, key[1], first=verdict.first_missing, last=verdict.last_missing)
        self._buffer(server, message.seq, message.batch)

    def _buffer(self, server: Server, seq: int, batch: EventBatch) -> None:
        rank = batch.dp_rank or 0
        epoch = self.streams[(server.pk, rank)].epoch
        self.pending.rows += event_rows(
            batch, server_id=server.pk, epoch=epoch, seq=seq, received_at=self.now()
        )
        self._count_blocks((server.pk, rank), batch)
        position = StreamPosition(server.pk, rank, epoch, seq, datetime.fromtimestamp(batch.ts, tz=UTC))
        previous = self.pending.positions.get((server.pk, rank))
        if previous is None or (position.epoch, position.last_seq) > (previous.epoch, previous.last_seq):
            self.pending.positions[(server.pk, rank)] = position
        for rejected in batch.rejected:
            self._reject(server, Rejection(rejected.code, rejected.reason), 1, head=rejected.head)

    def _count_blocks(self, key: tuple[int, int], batch: EventBatch) -> None:
        """Tally stored and removed blocks, and blocks stored again soon after their removal."""
        removals = self.removals.get(key)
        if removals is None:
            removals = self.removals[key] = RecentRemovals(settings.PREFIXSCOPE_THRASH_SECONDS)
        counts = self.pending.counts.setdefault(key, [0, 0, 0])
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._note_group(key[0], event)
                counts[0] += len(event.block_hashes)
                counts[2] += sum(removals.stored(h, batch.ts) for h in event.block_hashes)
            elif isinstance(event, BlockRemoved) and _is_pressure(event):
                # A request's own blocks freed as it ended, or a clear, is no room being made.
                counts[1] += len(event.block_hashes)
                for block_hash in event.block_hashes:
                    removals.removed(block_hash, batch.ts)

    def _note_group(self, server_id: int, event: BlockStored) -> None:
        """Remember the KV-cache group of a GPU BlockStored (its kind and block size): a hybrid
        model's groups set its effective block (app/domain/hitblock.py). Written when one changes."""
        if event.medium not in (None, "GPU"):
            return  # an offload tier's events: not a group of the engine's own cache
        known = self.groups.setdefault(server_id, {})
        group = str(event.group_idx or 0)
        seen: dict[str, str | int] = {"kind": event.kv_cache_spec_kind or "", "block_size": event.block_size}
        if known.get(group) != seen:
            known[group] = seen
            self.pending.groups[server_id] = dict(known)

    def _attention_groups(self) -> dict[int, int]:
        """Each server's attention group as its events named their groups' kinds so far (those
        of a batch are noted as it arrives, before its rows are stored): its block index follows it."""
        return {
            server_id: attention_group(kv_group_kinds(groups)) for server_id, groups in self.groups.items()
        }

    def _replay(self, server: Server, rank: int, *, first: int, last: int | None) -> int:
        """Buffer batches first..last from the replay endpoint and record what it lacked as lost;
        returns the batches recovered.

        With `last` None (catching up after our own restart) every newer batch is taken and no
        gap is recorded: the replay buffer is all there is to know.
        """
        recovered = 0
        for reply in self._fetch_replay(server, first):
            if reply.batch is None or (reply.batch.dp_rank or 0) != rank or reply.seq < first:
                continue
            if last is None:
                state, verdict = observe_seq(self.streams.get((server.pk, rank)), reply.seq, reply.batch.ts)
                if isinstance(verdict, Duplicate):
                    continue
                self.streams[(server.pk, rank)] = state
            elif reply.seq > last:
                continue
            self._buffer(server, reply.seq, reply.batch)
            recovered += 1
        if last is not None:
            epoch = self.streams[(server.pk, rank)].epoch
            lost = last - first + 1 - recovered
            self.pending.gaps.append(
                GapRecord(server.pk, rank, epoch, first, last, recovered, lost, self.now())
            )
            if lost:
                logger.warning("%s: %d KV event batches lost (seq %d-%d)", server.name, lost, first, last)
        return recovered

    def _fetch_replay(self, server: Server, first: int) -> list[ReplayReply]:
        """The replay from `first` on; asked a second time, with twice the time, when the first
        answer could come later (`retryable`: a slow or busy server), since what it does not
        return is recorded as lost for good. An answer that cannot come (a refused endpoint, an
        unreadable reply) is not asked again."""
        if not server.kv_replay_endpoint:
            return []
        timeouts = (self.replay_timeout_seconds, 2 * self.replay_timeout_seconds)
        for attempt, timeout in enumerate(timeouts, start=1):
            try:
                return fetch_replay(self.context, server.kv_replay_endpoint, first, timeout_seconds=timeout)
            except KVTransportError as exc:
                logger.warning("replay from %s failed (try %d of 2): %s", server.name, attempt, exc)
                if not exc.retryable:
                    break
        return []

    def _reject(self, server: Server, why: Rejection, count: int, *, head: bytes = b"") -> None:
        # The detail names frames and fields, never values; the head may hold token ids: not logged.
        logger.warning("rejected KV input from %s: %s (%s)", server.name, why.code, why.detail)
        key = (server.pk, why)
        self.pending.rejected[key] = self.pending.rejected.get(key, 0) + count
        if head:
            self.pending.samples.append(Sample(server.pk, why.code, head, self.now()))

    def flush(self) -> int:
        """Write the buffered rows, positions and gaps in one transaction; returns new rows.

        When PostgreSQL is away the buffer is kept and retried at the next flush; the stream
        positions are not committed either, so a crash meanwhile is mended by replay.
        """
        self.last_flush = time.monotonic()
        pending = self.pending
        if not pending:
            return 0
        try:
            stored = store_kv_events(
                rows=pending.rows,
                positions=list(pending.positions.values()),
                gaps=pending.gaps,
                counts=[StreamCounts(*key, *tally) for key, tally in pending.counts.items()],
                attention=self._attention_groups(),
            )
            self._count_rejections(pending.rejected)
            keep_undecodable_samples(pending.samples, now=self.now())
            for server_id, groups in pending.groups.items():
                record_kv_cache_groups(server_id=server_id, groups=groups)
        except (OperationalError, InterfaceError) as exc:  # PostgreSQL away: keep the buffer, retry
            logger.warning("cannot store %d KV event rows yet: %s", len(pending.rows), exc)
            return 0
        except DatabaseError as exc:  # the data itself is refused (e.g. no partition for its time)
            logger.error("refused %d KV event rows: %s", len(pending.rows), exc)
            refused = dict(pending.rejected)
            why = Rejection(RejectReason.NOT_STORABLE, f"refused by the database: {exc.__class__.__name__}")
            for row in pending.rows:
                refused[(row.server_id, why)] = refused.get((row.server_id, why), 0) + 1
            self.pending = Pending(rejected=refused, samples=pending.samples)
            return 0
        self.pending = Pending()
        self._prune_removals()
        return stored

    def _prune_removals(self) -> None:
        """Now and then (a pass over every remembered removal is not for each flush)."""
        now = time.time()
        if now - self.pruned_at < PRUNE_SECONDS:
            return
        self.pruned_at = now
        for removals in self.removals.values():
            removals.prune(now)

    def _count_rejections(self, rejected: dict[tuple[int, Rejection], int]) -> None:
        for (server_id, why), count in rejected.items():
            count_rejected_input(
                server_id=server_id,
                source=SOURCE,
                code=why.code,
                detail=why.detail,
                count=count,
                now=self.now(),
            )

    def close(self) -> None:
        self.flush()
        for socket in self.servers:
            socket.close(linger=0)
