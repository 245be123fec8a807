"""Request records per second through POST /api/v1/requests, against raw COPY of the same rows.

    DATABASE_URL=postgres://... .venv/bin/python -m bench.bench_rest_ingest \
        [--records 20000] [--batch 1000] [--rounds 3]

Runs in a throw-away database (created and dropped on the server DATABASE_URL names). The
baseline is psycopg COPY of equivalent rows straight into traffic_requestrecord, measured in the
same run; the endpoint is driven through Django's full request stack (middleware, auth, JSON
parsing, validation, the service's COPY and merge), in this process. Both sides' inputs (the
baseline's rows, the client's JSON bodies) are built before their clocks start. The machine may
be shared: each round times the baseline (one COPY of --records rows; and, printed beside it,
the same rows in committed COPYs of --batch rows, the durable work the endpoint does per batch)
and then the endpoint (--records records), and the rates are over all rounds, so that both see
the same load; each is warmed up once first.
"""

import argparse
import json
import os
import time
import uuid
from datetime import UTC, datetime

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "app.settings")
os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver")

import django

django.setup()

from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.utils import timezone  # noqa: E402

from app.api.services import create_ingest_token  # noqa: E402
from app.core.services import maintain_partitions  # noqa: E402
from app.fleet.models import Server  # noqa: E402


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
    columns = "server_id, request_id, arrived_at, model, tenant, source, ttft_seconds, prompt_tokens, cached_tokens, completion_tokens, trace_id, salt_hash, block_hashes"  # noqa: E501
    rows: list[tuple[object, ...]] = [
        (server_id, f"copy-{uuid.uuid4().hex}", now, "tiny", "acme", "rest", 0.05, 2048, 1536, 16, "", "", [])
        for _ in range(count)
    ]
    started = time.perf_counter()
    for start in range(0, count, batch):
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY traffic_requestrecord ({columns}) FROM STDIN") as copy,
        ):
            for row in rows[start : start + batch]:
                copy.write_row(row)
    return time.perf_counter() - started


def through_endpoint(bodies: list[bytes], token: str) -> float:
    """Seconds to post the bodies; the client's JSON encoding is done before the clock starts."""
    client = Client()
    started = time.perf_counter()
    for body in bodies:
        response = client.post(
            "/api/v1/requests", body, content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )  # fmt: skip
        assert response.status_code == 200, response.content[:500]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    count = args.records // args.batch * args.batch
    baseline_seconds = batched_seconds = endpoint_seconds = 0.0
    setup_test_environment()
    test_database = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        maintain_partitions(now=timezone.now())
        server = Server.objects.create(name="bench", base_url="http://bench:8000", block_size=32)
        token = create_ingest_token(name="bench")
        copy_baseline(args.batch, server.pk, batch=args.batch)  # warm-up: lazy imports and set-up
        through_endpoint([json.dumps(records(args.batch, "bench")).encode()], token)
        for _ in range(args.rounds):
            baseline_seconds += copy_baseline(count, server.pk, batch=count)
            batched_seconds += copy_baseline(count, server.pk, batch=args.batch)
            bodies = [json.dumps(records(args.batch, "bench")).encode() for _ in range(count // args.batch)]
            endpoint_seconds += through_endpoint(bodies, token)
    finally:
        connection.creation.destroy_test_db(test_database, verbosity=0)
    total = count * args.rounds
    baseline, batched, endpoint = total / baseline_seconds, total / batched_seconds, total / endpoint_seconds
    print(f"raw COPY into traffic_requestrecord, all {count} rows in one COPY: {baseline:,.0f} records/s")
    print(
        f"raw COPY into traffic_requestrecord, {args.batch} rows per committed COPY: {batched:,.0f} records/s"
    )
    print(f"POST /api/v1/requests (batches of {args.batch}, {args.rounds} rounds): {endpoint:,.0f} records/s")
    print(f"ratio endpoint / one COPY: {endpoint / baseline:.2f}  (target: >= 0.50)")
    print(f"ratio endpoint / COPY in the endpoint's batches: {endpoint / batched:.2f}")


if __name__ == "__main__":
    main()
