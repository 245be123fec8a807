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

from app.traffic.services.requests import TABLE_TYPES, RecordRow
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


def stream_seconds(streams: Sequence[bytes]) -> float:
    """Seconds to COPY the pre-built streams into the reset table, one COPY each, each committed."""
    reset_request_records()
    started = time.perf_counter()
    for stream in streams:
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY traffic_requestrecord ({_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.write(stream)
    return time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class Rates:
    """Records per second over all rounds."""

    limit: float  # the baseline: one COPY of a round's rows, pre-built
    batched_limit: float  # the same rows pre-built in committed COPYs of the endpoint's batch size
    endpoint: dict[int, float]  # by number of senders
    throttled: dict[int, int]  # 429s waited out, by number of senders


def timed_rounds(
    rows_per_round: int,
    rounds: int,
    senders: Sequence[int],
    *,
    streams: Streams,
    post: Callable[[int], Posted],
) -> Rates:
    """Each round times the baseline (the pre-built `streams`, whole and batched) and then the endpoint
    with each number of senders (`post(senders)`, which resets the table first), so that all see
    the same load on a shared machine; the rates are over all rounds."""
    one_seconds = batched_seconds = 0.0
    seconds, throttled = dict.fromkeys(senders, 0.0), dict.fromkeys(senders, 0)
    for _ in range(rounds):
        one_seconds += stream_seconds([streams.whole])
        batched_seconds += stream_seconds(streams.batches)
        for count in senders:
            posted = post(count)
            seconds[count] += posted.seconds
            throttled[count] += posted.throttled
    total = rows_per_round * rounds
    endpoint = {count: total / spent for count, spent in seconds.items()}
    return Rates(total / one_seconds, total / batched_seconds, endpoint, throttled)


def print_rates(rates: Rates, *, copied: str, batch: int, posted: str, by: str = "sender(s)") -> None:
    """The limit's two rates (`copied` says what was copied where) and the endpoint's rate per number
    of senders (`posted` says what was sent where), with the ratios to the limit."""
    print(f"{copied}, pre-built stream in one COPY (the limit): {rates.limit:,.0f} records/s")
    print(
        f"{copied}, pre-built stream, {batch} rows per committed COPY: {rates.batched_limit:,.0f} records/s"
    )
    for senders, rate in rates.endpoint.items():
        throttled = rates.throttled[senders]
        print(f"{posted}, {senders} {by}: {rate:,.0f} records/s, 429s waited out: {throttled}")
        print(f"  ratio to the limit: {rate / rates.limit:.2f}  (target: >= 0.50)")
        print(f"  ratio to the pre-built stream in the endpoint's batches: {rate / rates.batched_limit:.2f}")
