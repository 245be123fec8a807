"""The ingest benches' baseline (raw psycopg COPY of prepared rows into traffic_requestrecord), the
one state of that table every timed run starts from, and the rounds that time both in turn.

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

from django.db import connection, transaction
from django.utils import timezone

from bench.served import Posted

_FILLER = "fill-"  # request ids of the filler records


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


def copy_seconds(columns: Sequence[str], rows: Sequence[tuple[object, ...]], *, batch: int) -> float:
    """Seconds to COPY the rows (built before the clock starts) into the reset table, `batch` rows
    per COPY, each COPY committed on its own."""
    reset_request_records()
    started = time.perf_counter()
    for start in range(0, len(rows), batch):
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY traffic_requestrecord ({', '.join(columns)}) FROM STDIN") as copy,
        ):
            for row in rows[start : start + batch]:
                copy.write_row(row)
    return time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class Rates:
    """Records per second over all rounds."""

    one_copy: float  # the baseline: one COPY of a round's rows
    batched_copy: float  # the same rows in committed COPYs of the endpoint's batch size
    endpoint: dict[int, float]  # by number of senders
    throttled: dict[int, int]  # 429s waited out, by number of senders


def timed_rounds(
    rows_per_round: int,
    rounds: int,
    senders: Sequence[int],
    *,
    one_copy: Callable[[], float],
    batched_copy: Callable[[], float],
    post: Callable[[int], Posted],
) -> Rates:
    """Each round times the baseline (`one_copy`, `batched_copy`: seconds) and then the endpoint with
    each number of senders (`post(senders)`, which resets the table first), so that all see the same
    load on a shared machine; the rates are over all rounds."""
    one_seconds = batched_seconds = 0.0
    seconds, throttled = dict.fromkeys(senders, 0.0), dict.fromkeys(senders, 0)
    for _ in range(rounds):
        one_seconds += one_copy()
        batched_seconds += batched_copy()
        for count in senders:
            posted = post(count)
            seconds[count] += posted.seconds
            throttled[count] += posted.throttled
    total = rows_per_round * rounds
    endpoint = {count: total / spent for count, spent in seconds.items()}
    return Rates(total / one_seconds, total / batched_seconds, endpoint, throttled)


def print_rates(rates: Rates, *, copied: str, batch: int, posted: str) -> None:
    """The baseline's two rates (`copied` says what was copied where) and each number of senders'
    rate (`posted` says what was posted where), with the ratios to the baseline."""
    print(f"{copied}, all in one COPY: {rates.one_copy:,.0f} records/s")
    print(f"{copied}, {batch} rows per committed COPY: {rates.batched_copy:,.0f} records/s")
    for senders, rate in rates.endpoint.items():
        throttled = rates.throttled[senders]
        print(f"{posted}, {senders} sender(s): {rate:,.0f} records/s, 429s waited out: {throttled}")
        print(f"  ratio to one COPY: {rate / rates.one_copy:.2f}  (target: >= 0.50)")
        print(f"  ratio to COPY in the endpoint's batches: {rate / rates.batched_copy:.2f}")
