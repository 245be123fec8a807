"""The ingest benches' baseline, the server's limit: COPY of a pre-built binary stream of the very rows
the endpoint stores into traffic_requestrecord, with no client-side work in the clock. Also the one
state of that table every timed run starts from, and the rounds that time both in turn.

The stream is what psycopg writes for the rows (binary COPY, `set_types` with the ingest's column
types, `write_row`), recorded once, untimed, while copying them into a temporary table of the same
columns; the timed COPY only sends it (`copy.write`). So the limit is PostgreSQL's: parsing the rows,
TOASTing the arrays, the indexes, WAL and the commit's fsync.

A COPY's cost per row depends on how many rows the partition already holds (bigger indexes, more
of them outside the buffer cache): one COPY of 20,000 rows ran at 58,000 rows/s into an empty
partition and at 30,000 into one holding a million. So every run, baseline or endpoint, starts
from the same table: `table_rows` filler records of today (a busy fleet's partition holds millions
by mid-day; an empty one exists the first minutes after midnight), the rows of the runs before it
deleted and vacuumed away. Without this the endpoint, timed after the baseline in each round, paid
for the baseline's rows.
"""

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from psycopg import Cursor
from psycopg.abc import Buffer
from psycopg.copy import LibpqWriter

from app.traffic.services.record_rows import TABLE_TYPES, RecordRow
from bench.harness import backend_cpu, backend_pid, print_baseline, print_figure, verdict
from bench.served import Posted

_FILLER = "fill-"  # request ids of the filler records
_COLUMNS = ", ".join(RecordRow._fields)
_HEADER, _TRAILER = 19, 2  # bytes of a binary COPY stream's signature and header, and its trailer


def fill_request_records(server_id: int, table_rows: int) -> None:
    """Empty traffic_requestrecord, then COPY `table_rows` records of today into it."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE traffic_requestrecord")
        with cursor.cursor.copy(
            "COPY traffic_requestrecord (server_id, request_id, arrived_at, trace_id, source, prompt_tokens, "
            "cached_tokens, model, tenant, salt_hash, block_hashes) FROM STDIN"
        ) as copy:
            for _ in range(table_rows):
                trace = uuid.uuid4().hex
                copy.write_row(
                    (server_id, f"{_FILLER}{trace}", now, trace, "rest", 2048, 1536, "", "", "", [])
                )
        cursor.execute("VACUUM ANALYZE traffic_requestrecord")


def reset_request_records() -> None:
    """Back to the filler records alone: what the last run stored deleted, its space vacuumed."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM traffic_requestrecord WHERE request_id NOT LIKE %s", [f"{_FILLER}%"])
        cursor.execute("VACUUM traffic_requestrecord")


class _Recorder(LibpqWriter):
    """Sends a COPY's data as psycopg does, and keeps a copy of it."""

    def __init__(self, cursor: Cursor[Any]) -> None:
        super().__init__(cursor)
        self.data = bytearray()

    def write(self, data: Buffer) -> None:
        self.data += data
        super().write(data)


@dataclass(frozen=True, slots=True)
class Streams:
    """Pre-built binary COPY streams of one set of rows: all in one, and in the endpoint's batches."""

    whole: bytes
    batches: list[bytes]


def recorded_streams(rows: Sequence[RecordRow], *, batch: int) -> Streams:
    """The binary COPY stream psycopg writes for the rows, one per `batch` rows and one of them all."""
    batches = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE bench_stream (LIKE traffic_requestrecord INCLUDING DEFAULTS) ON COMMIT DROP"
        )
        for start in range(0, len(rows), batch):
            recorder = _Recorder(cursor.cursor)
            with cursor.cursor.copy(
                f"COPY bench_stream ({_COLUMNS}) FROM STDIN (FORMAT BINARY)", writer=recorder
            ) as copy:
                copy.set_types(TABLE_TYPES)
                for row in rows[start : start + batch]:
                    copy.write_row(row)
            batches.append(bytes(recorder.data))
            cursor.execute("TRUNCATE bench_stream")
    # One stream of them all: the first one's signature, every batch's rows, one trailer.
    whole = batches[0][:_HEADER] + b"".join(s[_HEADER:-_TRAILER] for s in batches) + batches[0][-_TRAILER:]
    return Streams(whole, batches)


def stream_seconds(streams: Sequence[bytes]) -> Posted:
    """COPY the pre-built streams into the reset table, one COPY each, each committed: the wall seconds
    and the CPU seconds of this connection's PostgreSQL backend (None when not readable here)."""
    reset_request_records()
    backend = backend_pid()
    cpu_before, started = backend_cpu(backend), time.perf_counter()
    for stream in streams:
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY traffic_requestrecord ({_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.write(stream)
    seconds, cpu_after = time.perf_counter() - started, backend_cpu(backend)
    database_cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Posted(seconds, 0, 0.0, database_cpu)


@dataclass(slots=True)
class Totals:
    """What the runs of one side spent over all rounds."""

    seconds: float = 0.0
    cpu: float = 0.0
    database_cpu: float | None = 0.0
    throttled: int = 0

    def add(self, posted: Posted) -> None:
        self.seconds += posted.seconds
        self.cpu += posted.cpu
        self.throttled += posted.throttled
        if self.database_cpu is not None and posted.database_cpu is not None:
            self.database_cpu += posted.database_cpu
        else:
            self.database_cpu = None


@dataclass(frozen=True, slots=True)
class Rates:
    """Over all rounds: the baseline's and the endpoint's totals, and the records they stored."""

    records: int
    limit: Totals  # the baseline: one COPY of a round's rows, pre-built
    batched_limit: Totals  # the same rows pre-built in committed COPYs of the endpoint's batch size
    endpoint: dict[int, Totals]  # by number of senders


def timed_rounds(
    rows_per_round: int,
    rounds: int,
    senders: Sequence[int],
    *,
    streams: Streams,
    post: Callable[[int], Posted],
) -> Rates:
    """Each round times the baseline (the pre-built `streams`, whole and batched) and then the endpoint
    with each number of senders (`post(senders)`, the table reset before each), so that all see the
    same load on a shared machine; the totals are over all rounds. The baseline is warmed up first
    (lazy imports and set-up); the caller warms up the endpoint."""
    stream_seconds(streams.batches[:1])
    limit, batched, endpoint = Totals(), Totals(), {count: Totals() for count in senders}
    for _ in range(rounds):
        limit.add(stream_seconds([streams.whole]))
        batched.add(stream_seconds(streams.batches))
        for count in senders:
            reset_request_records()
            endpoint[count].add(post(count))
    return Rates(rows_per_round * rounds, limit, batched, endpoint)


TARGET = 2.0  # the endpoint's CPU per record, at most this many times PostgreSQL's per COPY row
US = "us CPU/rec"


def print_rates(rates: Rates, *, copied: str, batch: int, posted: str, by: str = "sender(s)") -> None:
    """The headline per CPU second: the CPU the endpoint's process spends per record against the CPU
    PostgreSQL's backend spends per row of the baseline's COPY (`copied` says what was copied where),
    PASS when at most TARGET times it; then PostgreSQL's CPU serving the endpoint, and the wall rates
    (`posted` says what was sent where)."""
    n = rates.records
    base = _per_record(rates.limit.database_cpu, n)
    print(f"\n{copied}; {posted}")
    if base is None:
        print("  PostgreSQL runs on another machine: its backends' CPU is not readable, no CPU ratio")
        base = float("nan")
    else:
        print_baseline("  PostgreSQL CPU per row, one COPY", base, US)
        print_figure(
            f"  PostgreSQL CPU per row, COPYs of {batch}",
            _per_record(rates.batched_limit.database_cpu, n) or 0.0,
            US,
            base,
        )
    for senders, spent in rates.endpoint.items():
        web = spent.cpu / n * 1e6
        print_figure(
            f"  web process CPU per record, {senders} {by}",
            web,
            US,
            base,
            f"{verdict(web <= TARGET * base)} (target <= x{TARGET:g})",
        )
        served = _per_record(spent.database_cpu, n)
        if served is not None:
            print_figure("  PostgreSQL CPU per record serving it", served, US, base)
    print(
        f"  wall, records/s (the baseline first, then by {by}): "
        + ", ".join(
            f"{n / t.seconds:,.0f}" for t in [rates.limit, rates.batched_limit, *rates.endpoint.values()]
        )
        + f"; 429s waited out: {sum(t.throttled for t in rates.endpoint.values())}"
    )


def _per_record(seconds: float | None, records: int) -> float | None:
    return None if seconds is None else seconds / records * 1e6
