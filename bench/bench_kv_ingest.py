"""KV events decoded and stored per second (one core), against raw COPY of the same rows.

    DATABASE_URL=postgres://... .venv/bin/python -m bench kv_ingest [--batches 4000]

Runs in a throw-away database on the server DATABASE_URL names. The captured SUB messages are
replayed with fresh sequence numbers and times; each is decoded (collectors.kv_events.parse),
turned into rows (app.traffic.collection.kv_collector.event_rows) and stored with the block index and stream
position (app.traffic.services.kv_events.store_kv_events), flushing every 200 messages as the
subscriber does. The baseline is psycopg COPY of the same rows straight into traffic_kvevent.
The collector's rate is also given per second of this process's CPU time, where waiting on PostgreSQL
is not counted.
"""

import argparse
import gc
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec
from django.db import connection

from app.domain.blockhash import wire_to_signed
from app.fleet.models import Server
from app.traffic.collection.kv_collector import event_rows
from app.traffic.services.kv_events import KVEventRow, StreamPosition, store_kv_events
from bench.harness import backend_cpu, backend_pid, print_baseline, print_figure, throwaway_database, verdict
from collectors.kv_events.parse import decode_sub_message
from tests.support.captures import load_json

FLUSH_EVERY = 200


def messages(count: int) -> list[list[bytes]]:
    """`count` SUB messages cycling through the capture, renumbered and stamped with today's time."""
    captured = [bytes.fromhex(m["payload_hex"]) for m in load_json("kv-live.msgpack-frames.json")]
    now = time.time()
    frames = []
    for seq in range(count):
        batch = msgspec.msgpack.decode(captured[seq % len(captured)])
        batch[0] = now + seq / 1000
        frames.append([b"kv@bench", seq.to_bytes(8, "big"), msgspec.msgpack.encode(batch)])
    return frames


def through_collector(frames: list[list[bytes]], server_id: int) -> tuple[float, float, int]:
    """Events stored per second of wall time and per second of this process's CPU time."""
    stored, rows, started, cpu_started = 0, [], time.perf_counter(), time.process_time()
    received = datetime.now(UTC)
    for seq, frame in enumerate(frames, start=1):
        message = decode_sub_message(frame)
        rows += event_rows(message.batch, server_id=server_id, epoch=0, seq=message.seq, received_at=received)
        if seq % FLUSH_EVERY == 0 or seq == len(frames):
            at = datetime.fromtimestamp(message.batch.ts, tz=UTC)
            stored += store_kv_events(rows=rows, positions=[StreamPosition(server_id, 0, 0, message.seq, at)])
            rows = []
    return stored / (time.perf_counter() - started), stored / (time.process_time() - cpu_started), stored


def copy_baseline(rows: list[KVEventRow]) -> tuple[float, float | None]:
    """Rows per second of the COPY, and the CPU seconds its PostgreSQL backend spent per row (None:
    not readable here)."""
    columns = ", ".join(KVEventRow._fields)
    backend = backend_pid()
    cpu_before, started = backend_cpu(backend), time.perf_counter()
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY traffic_kvevent ({columns}) FROM STDIN") as copy,
    ):
        for row in rows:
            signed_hash = None if row.block_hash is None else wire_to_signed(row.block_hash)
            signed_parent = None if row.parent_hash is None else wire_to_signed(row.parent_hash)
            copy.write_row(row._replace(block_hash=signed_hash, parent_hash=signed_parent))
    rate, cpu_after = len(rows) / (time.perf_counter() - started), backend_cpu(backend)
    per_row = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) / len(rows)
    return rate, per_row


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=4000)
    args = parser.parse_args(argv)
    with throwaway_database():
        server = Server.objects.create(name="bench", base_url="http://bench:8000")
        frames = messages(args.batches)
        gc.freeze()  # as manage.py collect_kv_events does once it has started
        rate, cpu_rate, stored = through_collector(frames, server.pk)
        other = Server.objects.create(name="baseline", base_url="http://baseline:8000")
        received = datetime.now(UTC)
        rows = []
        for frame in frames:
            message = decode_sub_message(frame)
            rows += event_rows(
                message.batch, server_id=other.pk, epoch=0, seq=message.seq, received_at=received
            )
        baseline, copy_cpu = copy_baseline(rows)
    print(f"{stored:,} block rows; target: >= 50,000 events/s per CPU second of the collector")
    print_baseline("raw COPY of the same rows into traffic_kvevent", baseline, "events/s")
    print_figure("the collector's path, wall", rate, "events/s", baseline)
    print_figure("the collector's path, per CPU second", cpu_rate, "events/s", baseline,
                 f"{verdict(cpu_rate >= 50_000)}; this process's CPU, PostgreSQL's not counted")  # fmt: skip
    if copy_cpu is not None:
        print(f"(PostgreSQL's CPU per COPY row: {copy_cpu * 1e6:.2f} us, the collector's per event: "
              f"{1e6 / cpu_rate:.2f} us)")  # fmt: skip
