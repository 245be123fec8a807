"""The gateway's writer: observed requests go through a bounded queue to PostgreSQL, in batches.

The proxy calls `record` and `reject` on its event loop; both return at once. A full queue drops
the record and counts it (reason "queue full"), it never blocks the proxy. A writer thread wakes every
`flush_seconds` (goes on at once while a full batch waits), takes what has queued up and stores it
in batches with `ingest_request_records`. The queue is a plain deque the thread polls: a
queue.Queue would wake the thread, and take the GIL from the proxy, once per record.

A gateway fronting many servers has one GatewayWriter (queue, spill file, counts) per server but a
`WriterPool` of a few threads, each with its own database connection and its share of the servers:
the connections a gateway holds are the pool's size, not its server count (a thread per server ran a
100-server gateway out of PostgreSQL's 100 default connections, and everything spilled).

While PostgreSQL cannot be reached, batches are appended to a local JSON-lines spill file instead,
and the file is replayed (then deleted) once a write succeeds again; storing is an idempotent
merge, so a batch replayed twice is stored once. `stop` drains the queue into the database or the
spill file: every record `record` accepted is stored or spilled by then.

A process killed hard (SIGKILL, the OOM killer) loses what is only in its memory: the records in
the queue (at most `capacity`), the batch being written (at most `batch_size`) and the rejection
counts not yet added. What was committed, or fsynced to the spill file, is kept: the next writer
with the same spill file replays it, and a line torn by the kill costs that line only.

The spill file holds what the database would get before it hashes it: the cache salt and the
prompt token ids. It is created readable by its owner only and deleted once replayed.
"""

import logging
import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections, connection
from django.utils import timezone

from app.fleet.services import servers_named
from app.traffic.collection.processes import forget_collector_process, report_collector_process
from app.traffic.models import CollectorProcess, RequestRecord
from app.traffic.services.rejections import count_rejected_input
from app.traffic.services.requests import IngestOutcome, ingest_request_records
from collectors.errors import Rejection, RejectReason
from collectors.records import RequestFacts

logger = logging.getLogger(__name__)

SOURCE = RequestRecord.Source.GATEWAY.value
# The writer threads' connections, as pg_stat_activity shows them: the gateway's host and process id.
APPLICATION_NAME = f"prefixscope-gateway:{socket.gethostname()[:24]}:{os.getpid()}"
QUEUE_FULL = Rejection(RejectReason.QUEUE_FULL, "queue full: record dropped")
SPILL_UNWRITABLE = Rejection(RejectReason.SPILL_UNWRITABLE, "spill file not writable: record dropped")
REPORT_SECONDS = 10.0
Store = Callable[..., IngestOutcome]  # ingest_request_records(facts, *, source, now, default_server)
# A spill line is RequestFacts as JSON: msgspec writes and checks the struct (times in RFC 3339).
_SPILL_ENCODER = msgspec.json.Encoder()
_SPILL_DECODER = msgspec.json.Decoder(RequestFacts)


class GatewayWriter:
    """Records of the server `server` (a registered name or the upstream's base URL), written in batches."""

    def __init__(
        self,
        *,
        server: str,
        spill_path: Path,
        capacity: int = 10_000,
        batch_size: int = 500,
        flush_seconds: float = 0.5,
        retry_seconds: float = 5.0,
        store: Store = ingest_request_records,
    ) -> None:
        self.server = server
        self.spill_path = spill_path
        self.capacity = capacity
        self.batch_size = batch_size
        self.flush_seconds = flush_seconds
        self.retry_seconds = retry_seconds
        self.store = store
        self.stored = 0
        self.spilled = 0
        self.dropped = 0  # since start; the database counts them too, as rejected input "queue full"
        self._queue: deque[RequestFacts] = deque()
        self._rejected: Counter[Rejection] = Counter()
        self._lock = threading.Lock()
        self._retry_at = 0.0  # monotonic time before which this server's records are not tried again
        self._reported_at = 0.0  # monotonic time of the last report of queue and spill file
        self.started_at = timezone.now()
        self._spilling = False  # the database failed and has not been written to since
        self.link = Link()  # the database connection's state, shared with the pool thread's other writers
        self._pool: WriterPool | None = None

    # --- the proxy's side: never blocks ----------------------------------------------------

    def record(self, facts: RequestFacts) -> None:
        if len(self._queue) < self.capacity:
            self._queue.append(facts)  # deque appends are atomic: no lock on the proxy's path
            return
        with self._lock:
            self.dropped += 1
            self._rejected[QUEUE_FULL] += 1

    def reject(self, why: Rejection) -> None:
        with self._lock:
            self._rejected[why] += 1

    # --- the writer thread -----------------------------------------------------------------

    def start(self) -> None:
        """Write from a thread of its own (a gateway of several servers shares a WriterPool instead)."""
        self._pool = WriterPool([self], connections=1)
        self._pool.start()

    def stop(self, timeout: float | None = None) -> None:
        """Write (or spill) what is queued, then end the thread."""
        if self._pool is not None:
            self._pool.stop(timeout)

    # --- called by the pool thread this writer belongs to ----------------------------------

    def has_full_batch(self) -> bool:
        return len(self._queue) >= self.batch_size

    def idle(self) -> bool:
        return not self._queue

    def step(self) -> None:
        """Store (or spill) one batch of what has queued up; replay the spill file; report when due."""
        batch = self._take_batch()
        if batch or self.spill_path.exists() or self._report_due():
            self._write_or_keep(batch)

    def finish(self) -> None:
        """A last try at replaying the spill file before the process ends; then the process's report
        is withdrawn (kept, to go silent, while records wait in the spill file for a successor)."""
        if self.spill_path.exists():
            self._retry_at = self.link.retry_at = 0.0
            self._write_or_keep([])
        if self.spill_path.exists():
            return
        try:
            forget_collector_process(kind=CollectorProcess.Kind.GATEWAY, name=self.server)
        except DatabaseError as exc:
            logger.warning("cannot withdraw the gateway's report of %s: %s", self.server, exc)

    def _write_or_keep(self, items: list[RequestFacts]) -> None:
        try:
            self._write(items)
        except Exception:  # a bug must not end the writer; the batch waits in the spill file
            logger.exception("writing %d request records failed; spilling them", len(items))
            self._retry_at = time.monotonic() + self.retry_seconds
            self._spill(items)

    def _take_batch(self) -> list[RequestFacts]:
        """Up to `batch_size` of the records queued, oldest first."""
        batch: list[RequestFacts] = []
        while self._queue and len(batch) < self.batch_size:
            batch.append(self._queue.popleft())
        return batch

    def _write(self, items: list[RequestFacts]) -> None:
        """Store `items` after replaying the spill file; spill them while the database is down."""
        if time.monotonic() < max(self._retry_at, self.link.retry_at):
            self._spill(items)
            return
        close_old_connections()
        try:
            self._report()
            self._replay()
            self._store(items)
            self._flush_rejected()
        except (OperationalError, InterfaceError) as exc:
            if not self._spilling:
                logger.warning(
                    "database unavailable, spilling request records to %s: %s", self.spill_path, exc
                )
            self._spilling = True
            connection.close()
            # The connection is the pool thread's: its other servers spill too until the retry.
            self.link.retry_at = time.monotonic() + self.retry_seconds
            self._spill(items)
            return
        if self._spilling:
            logger.info("database back; spilled request records of %s replayed", self.server)
        self._spilling = False
        self._retry_at = self.link.retry_at = 0.0

    def _report_due(self) -> bool:
        return time.monotonic() - self._reported_at >= REPORT_SECONDS

    def _report(self) -> None:
        """Every REPORT_SECONDS, the queue's depth and the spill file's size for /metrics (before
        the spill file is replayed: what piled up while the database was away is seen once)."""
        if not self._report_due():
            return
        spill_bytes = self.spill_path.stat().st_size if self.spill_path.exists() else 0
        report_collector_process(
            kind=CollectorProcess.Kind.GATEWAY,
            name=self.server,
            started_at=self.started_at,
            queue_depth=len(self._queue),
            spill_bytes=spill_bytes,
            now=timezone.now(),
        )
        self._reported_at = time.monotonic()

    def _store(self, items: Sequence[RequestFacts]) -> None:
        """Store in batches; a batch the database refuses for its data is stored item by item."""
        for start in range(0, len(items), self.batch_size):
            batch = items[start : start + self.batch_size]
            try:
                self._count(self._stored(batch))
            except (OperationalError, InterfaceError):
                raise
            except DatabaseError:
                logger.exception("a batch of %d request records was refused; storing one by one", len(batch))
                self._store_each(batch)

    def _store_each(self, items: Sequence[RequestFacts]) -> None:
        for item in items:
            try:
                self._count(self._stored([item]))
            except (OperationalError, InterfaceError):
                raise
            except DatabaseError as exc:
                self.reject(Rejection(RejectReason.NOT_STORABLE, f"not storable: {exc.__class__.__name__}"))

    def _stored(self, items: Sequence[RequestFacts]) -> IngestOutcome:
        return self.store(items, source=SOURCE, default_server=self.server, now=timezone.now())

    def _count(self, outcome: IngestOutcome) -> None:
        self.stored += outcome.stored
        for _, why in outcome.rejected:
            self.reject(why)

    def _flush_rejected(self) -> None:
        with self._lock:
            counts, self._rejected = self._rejected, Counter()
        if not counts:
            return
        if counts[QUEUE_FULL]:
            logger.warning("%d request records dropped: the writer's queue was full", counts[QUEUE_FULL])
        server = servers_named([self.server], propose_unknown=False)[self.server]
        try:
            for why, count in counts.items():
                count_rejected_input(
                    server_id=server.pk if server else None,
                    source=SOURCE,
                    code=why.code,
                    detail=why.detail,
                    count=count,
                    now=timezone.now(),
                )
        except DatabaseError:
            with self._lock:
                self._rejected.update(counts)  # counted again at the next write
            raise

    # --- the spill file --------------------------------------------------------------------

    def _spill(self, items: Sequence[RequestFacts]) -> None:
        if not items:
            return
        try:
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.spill_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with open(descriptor, "a", encoding="utf-8") as spill:
                if self.spill_path.stat().st_size and _last_byte(self.spill_path) != b"\n":
                    spill.write("\n")  # a line torn by a crash stays one unreadable line
                spill.writelines(_SPILL_ENCODER.encode(item).decode() + "\n" for item in items)
                spill.flush()
                os.fsync(spill.fileno())
        except OSError as exc:
            logger.error("request records lost, the spill file %s is not writable: %s", self.spill_path, exc)
            with self._lock:
                self._rejected[SPILL_UNWRITABLE] += len(items)
            return
        self.spilled += len(items)

    def _replay(self) -> None:
        """Store what the spill file holds, then delete it (kept whole if the database fails again)."""
        if not self.spill_path.exists():
            return
        items, unreadable = read_spill(self.spill_path)
        self._store(items)
        self.spill_path.unlink()
        for _ in range(unreadable):
            self.reject(Rejection(RejectReason.SPILL_UNREADABLE, "spill file: unreadable line"))
        logger.info("replayed %d spilled request records from %s", len(items), self.spill_path)


class Link:
    """A pool thread's database connection: after it fails, its writers spill until `retry_at`
    (rather than each waiting for its own connection attempt to fail)."""

    def __init__(self) -> None:
        self.retry_at = 0.0  # monotonic time before which the database is not tried again


class WriterPool:
    """`connections` threads (at most one per writer), each writing the records of its share of the
    writers on one database connection of its own."""

    def __init__(self, writers: Sequence[GatewayWriter], *, connections: int) -> None:
        if connections < 1:
            raise ValueError("a writer pool needs at least one connection")
        count = min(connections, len(writers))
        self._shares = [list(writers[index::count]) for index in range(count)]
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(share,), name=f"gateway-writer-{index}", daemon=True)
            for index, share in enumerate(self._shares)
        ]
        for share in self._shares:
            link = Link()
            for writer in share:
                writer.link = link

    @property
    def connections(self) -> int:
        return len(self._threads)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Write (or spill) what every writer has queued, then end the threads."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout)

    def _run(self, writers: list[GatewayWriter]) -> None:
        flush_seconds = min(writer.flush_seconds for writer in writers)
        # This thread's own connection (Django's are per thread), named so that pg_stat_activity
        # shows which gateway process holds it; a copy of the settings, shared with other threads.
        options = {**connection.settings_dict.get("OPTIONS", {}), "application_name": APPLICATION_NAME}
        connection.settings_dict = {**connection.settings_dict, "OPTIONS": options}
        try:
            while not (self._stopping.is_set() and all(writer.idle() for writer in writers)):
                if not any(writer.has_full_batch() for writer in writers):
                    self._stopping.wait(flush_seconds)  # let batches gather: a write costs per batch
                for writer in writers:
                    writer.step()
            for writer in writers:
                writer.finish()
        finally:
            connection.close()


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1)


def read_spill(path: Path) -> tuple[list[RequestFacts], int]:
    """The records of a spill file, and how many of its lines could not be read (a torn last line)."""
    items, unreadable = [], 0
    with path.open(encoding="utf-8") as spill:
        for line in spill:
            try:
                items.append(_SPILL_DECODER.decode(line))
            except msgspec.DecodeError:
                unreadable += 1
    return items, unreadable
