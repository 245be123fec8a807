"""Request records per second through the gateway's writer (GatewayWriter -> ingest_request_records),
against the server's limit for the same rows.

    DATABASE_URL=postgres://... .venv/bin/python -m bench gateway_writer \
        [--kinds small 2k 8k] [--scale 1.0] [--rounds 3] [--batch 500] [--table-rows 0 1000000]

Runs in a throw-away database (created and dropped on the server DATABASE_URL names). The records
are those of the REST bench (bench/records.py: small ones, and prompts of 2K and 8K token ids whose
block hashes the writer's ingest computes), as the gateway's proxy hands them to its writer
(RequestFacts with the prompt's token ids). Each timed run queues a round's records in a new
GatewayWriter (untimed: the proxy's side only appends to a deque), then times the writer thread
from its start until it has stored them all, in batches of --batch (the gateway's default, 500).
This is the writer's path only; bench/bench_gateway.py measures the latency the proxy adds.

The baseline is the server's limit (bench/baseline.py): a pre-built binary COPY stream of exactly
the rows the writer stores, in one COPY and in committed COPYs of --batch rows, timed in the same
rounds. Every timed run starts from the same table: holding each of --table-rows records in turn.
The headline is per CPU second (bench/baseline.py, print_rates): this process's CPU per record
(the writer's thread; the proxy's side is idle) against PostgreSQL's backend CPU per COPY row.
"""

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from django.utils import timezone

from app.fleet.models import Server
from app.traffic.collection.gateway_writer import SOURCE, GatewayWriter
from bench.baseline import (
    Rates,
    fill_request_records,
    print_rates,
    recorded_streams,
    timed_rounds,
)
from bench.harness import throwaway_database
from bench.records import BLOCK_SIZE, KINDS, Kind, kinds_scaled, records
from bench.served import Posted
from collectors.records import RequestFacts

SERVER = "bench-gateway"


def written(facts: list[RequestFacts], *, batch: int, spill: Path) -> Posted:
    """Seconds for a new writer to store `facts`, queued before its thread starts."""
    writer = GatewayWriter(server=SERVER, spill_path=spill, capacity=len(facts), batch_size=batch)
    for item in facts:
        writer.record(item)
    started, cpu = time.perf_counter(), time.process_time()
    writer.start()
    writer.stop()  # drains the queue into the database, then ends the thread
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert writer.stored == len(facts) and not writer.spilled and not writer.dropped, (
        writer.stored, writer.spilled, writer.dropped,
    )  # fmt: skip
    # The writer's backend closes with its thread: its CPU is not read.
    return Posted(seconds, throttled=0, cpu=cpu, database_cpu=None)


def measure(args: argparse.Namespace, server_id: int, kind: Kind, spill: Path) -> Rates:
    """One kind's rates over all rounds, after one untimed warm-up of each side."""
    found = records(kind, [SERVER], timezone.now())
    streams = recorded_streams([r.row(server_id, source=SOURCE) for r in found], batch=args.batch)
    facts = [r.facts() for r in found]
    written(facts[: args.batch], batch=args.batch, spill=spill)
    return timed_rounds(
        len(facts), args.rounds, [1], streams=streams,
        post=lambda _: written(facts, batch=args.batch, spill=spill),
    )  # fmt: skip


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=list(KINDS))
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies each kind's records per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500, help="the writer's batch size")
    parser.add_argument("--table-rows", type=int, nargs="+", default=[0, 1_000_000])
    args = parser.parse_args(argv)
    kinds = kinds_scaled(args.kinds, args.scale)
    spill = Path(tempfile.mkdtemp()) / "spill.jsonl"
    with throwaway_database():
        server = Server.objects.create(name=SERVER, base_url=f"http://{SERVER}:8000", block_size=BLOCK_SIZE)
        results = {}
        for table_rows in args.table_rows:
            fill_request_records(server.pk, table_rows)
            for kind in kinds:
                results[table_rows, kind] = measure(args, server.pk, kind, spill)
    for (table_rows, kind), rates in results.items():
        into = f"into a table of {table_rows:,} records"
        print_rates(
            rates, copied=f"{kind.name}, {kind.records} rows {into}", batch=args.batch,
            posted=f"{kind.name}, GatewayWriter {into} ({args.rounds} rounds)", by="writer",
        )  # fmt: skip
