"""CPU per request record through POST /api/v1/requests, against PostgreSQL's CPU per row of a COPY of them.

    DATABASE_URL=postgres://... .venv/bin/python -m bench rest_ingest \
        [--kinds small 2k 8k] [--scale 1.0] [--rounds 3] [--servers 4] [--senders 1 2 4] \
        [--table-rows 0 1000000]

Runs in a throw-away database (created and dropped on the server DATABASE_URL names). Three kinds of
record (bench/records.py): small ones (counts and timings, 20,000 a round in batches of 1,000), and
prompts of 2K and 8K token ids (4,000 and 1,000 a round, in batches of 250 and 100), whose block
hashes the ingest computes; --scale multiplies the records per round. The baseline is the server's
limit (bench/baseline.py): a pre-built binary COPY stream of exactly the rows the endpoint stores,
hashes and token ids included, sent straight into traffic_requestrecord in the same run. The
endpoint is gunicorn serving Prefixscope as in production (bench/served.py), posted to over HTTP
by 1 and by several senders at once, each batch the records of one of --servers servers (a fleet's
gateways each send their own). Both sides' inputs (the stream, the client's JSON bodies) are built
before their clocks start. The machine may be shared: each round times the limit (one COPY of the
round's rows; and, printed beside it, the same rows in committed COPYs of the endpoint's batch
size, the durable work the endpoint does per batch) and then the endpoint per number of senders,
and the rates are over all rounds, so that all see the same load; each is warmed up once first.
Every timed run starts from the same table: holding each of --table-rows records in turn
(bench/baseline.py says why that matters).

The headline is per CPU second (bench/baseline.py, print_rates): the CPU seconds gunicorn's
processes spend per record, against the CPU seconds PostgreSQL's backend spends per row of the
baseline's COPY; target: at most twice. Beside it, PostgreSQL's CPU per record serving the
endpoint (its backends' CPU, when PostgreSQL runs on this machine), then the wall rates. CPU time
is counted in clock ticks (10 ms): give a run some seconds (--scale 0.5 at least).
"""

import argparse
from collections.abc import Sequence

import msgspec
from django.db import connection
from django.utils import timezone

from app.api.services import create_ingest_token
from app.fleet.models import Server
from bench.baseline import (
    Rates,
    fill_request_records,
    print_rates,
    recorded_streams,
    timed_rounds,
)
from bench.harness import throwaway_database
from bench.records import BLOCK_SIZE, KINDS, Kind, kinds_scaled, records
from bench.served import Batch, Posted, Served, post_all, post_measured, served

PATH, JSON = "/api/v1/requests", "application/json"


def measure(
    args: argparse.Namespace, server: Served, servers: dict[str, int], token: str, kind: Kind
) -> Rates:
    """One kind's rates over all rounds, after one untimed warm-up of each side."""
    found = records(kind, list(servers), timezone.now())
    streams = recorded_streams([r.row(servers[r.server], source="rest") for r in found], batch=kind.batch)
    bodies = [
        Batch(token, msgspec.json.encode([r.json() for r in found[start : start + kind.batch]]))
        for start in range(0, len(found), kind.batch)
    ]
    post_all(server.address, PATH, JSON, bodies[: 2 * len(servers)], 4)

    def post(senders: int) -> Posted:
        return post_measured(server, PATH, JSON, bodies, senders)

    return timed_rounds(len(found), args.rounds, args.senders, streams=streams, post=post)


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=list(KINDS))
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies each kind's records per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--senders", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--table-rows", type=int, nargs="+", default=[0, 1_000_000])
    args = parser.parse_args(argv)
    kinds = kinds_scaled(args.kinds, args.scale)
    with throwaway_database() as test_database:
        names = [f"bench-{n}" for n in range(args.servers)]
        created = Server.objects.bulk_create(
            [Server(name=name, base_url=f"http://{name}:8000", block_size=BLOCK_SIZE) for name in names]
        )
        servers = {server.name: server.pk for server in created}
        token = create_ingest_token(name="bench")
        connection.close()  # gunicorn's workers connect to the database on their own
        results = {}
        with served(test_database) as server:
            for table_rows in args.table_rows:
                fill_request_records(created[0].pk, table_rows)
                for kind in kinds:
                    results[table_rows, kind] = measure(args, server, servers, token, kind)
    for (table_rows, kind), rates in results.items():
        into = f"into a table of {table_rows:,} records"
        print_rates(
            rates, copied=f"{kind.name}, {kind.records} rows {into}", batch=kind.batch,
            posted=f"{kind.name}, POST {PATH} {into} (batches of {kind.batch}, {args.rounds} rounds)",
        )  # fmt: skip
