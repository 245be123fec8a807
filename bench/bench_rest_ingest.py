"""Request records per second through POST /api/v1/requests, against raw COPY of the same rows.

    DATABASE_URL=postgres://... .venv/bin/python -m bench.bench_rest_ingest \
        [--records 20000] [--batch 1000] [--rounds 3] [--servers 4] [--senders 1 4] \
        [--table-rows 0 1000000]

Runs in a throw-away database (created and dropped on the server DATABASE_URL names). The
baseline is psycopg COPY of equivalent rows straight into traffic_requestrecord, measured in the
same run; the endpoint is gunicorn serving Prefixscope as in production (bench/served.py), posted
to over HTTP by 1 and by several senders at once, each batch the records of one of --servers
servers (a fleet's gateways each send their own). Both sides' inputs (the baseline's rows, the
client's JSON bodies) are built before their clocks start. The machine may be shared: each round
times the baseline (one COPY of --records rows; and, printed beside it, the same rows in committed
COPYs of --batch rows, the durable work the endpoint does per batch) and then the endpoint
(--records records per number of senders), and the rates are over all rounds, so that all see
the same load; each is warmed up once first. Every timed run starts from the same table: holding
each of --table-rows records in turn (bench/baseline.py says why that matters).
"""

import argparse
import json
import os
import uuid
from datetime import UTC, datetime

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "app.settings")
os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.utils import timezone  # noqa: E402

from app.api.services import create_ingest_token  # noqa: E402
from app.core.services import maintain_partitions  # noqa: E402
from app.fleet.models import Server  # noqa: E402
from bench.baseline import (  # noqa: E402
    Rates,
    copy_seconds,
    fill_request_records,
    print_rates,
    reset_request_records,
    timed_rounds,
)
from bench.served import Batch, Posted, post_all, served  # noqa: E402

PATH, JSON = "/api/v1/requests", "application/json"


def records(count: int, server: str) -> list[dict[str, object]]:
    now = datetime.now(UTC).isoformat()
    return [
        {
            "server": server, "request_id": f"bench-{uuid.uuid4().hex}", "arrived_at": now, "model": "tiny",
            "tenant": "acme", "ttft_seconds": 0.05, "prompt_tokens": 2048, "cached_tokens": 1536,
            "completion_tokens": 16,
        }
        for _ in range(count)
    ]  # fmt: skip


def copy_baseline(count: int, server_id: int, *, batch: int) -> float:
    """Seconds for psycopg COPY of `count` rows like the records' (built before the clock starts),
    `batch` rows per COPY, each COPY committed on its own."""
    now = timezone.now()
    columns = (
        "server_id", "request_id", "arrived_at", "model", "tenant", "source", "ttft_seconds", "prompt_tokens",
        "cached_tokens", "completion_tokens", "trace_id", "salt_hash", "block_hashes",
    )  # fmt: skip
    rows: list[tuple[object, ...]] = [
        (server_id, f"copy-{uuid.uuid4().hex}", now, "tiny", "acme", "rest", 0.05, 2048, 1536, 16, "", "", [])
        for _ in range(count)
    ]
    return copy_seconds(columns, rows, batch=batch)


def batches(count: int, batch: int, servers: list[str], token: str) -> list[Batch]:
    """JSON bodies of `batch` records each, the servers taking turns."""
    return [
        Batch(token, json.dumps(records(batch, servers[n % len(servers)])).encode())
        for n in range(count // batch)
    ]


def measure(
    args: argparse.Namespace, address: tuple[str, int], server: Server, token: str, table_rows: int
) -> Rates:
    """The rates over all rounds, after one untimed warm-up; every timed run starts from the table
    holding `table_rows` records."""
    count, names = args.records // args.batch * args.batch, [f"bench-{n}" for n in range(args.servers)]
    fill_request_records(server.pk, table_rows)
    copy_baseline(args.batch, server.pk, batch=args.batch)  # warm-up: lazy imports and set-up
    post_all(address, PATH, JSON, batches(args.batch * args.servers * 2, args.batch, names, token), 4)

    def post(senders: int) -> Posted:
        bodies = batches(count, args.batch, names, token)
        reset_request_records()
        return post_all(address, PATH, JSON, bodies, senders)

    return timed_rounds(
        count, args.rounds, args.senders,
        one_copy=lambda: copy_baseline(count, server.pk, batch=count),
        batched_copy=lambda: copy_baseline(count, server.pk, batch=args.batch),
        post=post,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--senders", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--table-rows", type=int, nargs="+", default=[0, 1_000_000])
    args = parser.parse_args()
    setup_test_environment()
    test_database = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        maintain_partitions(now=timezone.now())
        names = [f"bench-{n}" for n in range(args.servers)]
        server = Server.objects.bulk_create(
            [Server(name=name, base_url=f"http://{name}:8000", block_size=32) for name in names]
        )[0]
        token = create_ingest_token(name="bench")
        connection.close()  # gunicorn's workers connect to the database on their own
        with served(test_database) as address:
            results = {rows: measure(args, address, server, token, rows) for rows in args.table_rows}
    finally:
        connection.creation.destroy_test_db(test_database, verbosity=0)
    count = args.records // args.batch * args.batch
    for table_rows, rates in results.items():
        into = f"into a table of {table_rows:,} records"
        print_rates(
            rates, copied=f"raw COPY {into} ({count} rows)", batch=args.batch,
            posted=f"POST {PATH} {into} (batches of {args.batch}, {args.rounds} rounds)",
        )  # fmt: skip


if __name__ == "__main__":
    main()
