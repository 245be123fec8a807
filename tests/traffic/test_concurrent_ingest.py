"""Two batches with the same request at once: the one that finds the other's record after looking
for it merges into it instead of failing or storing the request twice."""

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from app.fleet.models import Server
from app.traffic.models import RequestRecord
from app.traffic.services.requests import IngestOutcome, ingest_request_records
from collectors.records import RequestFacts, canonical_request_id
from tests.support.captures import load_json
from tests.support.sessions import session, wait_for_a_blocked_insert, wait_for_lock_waits

pytestmark = pytest.mark.django_db(transaction=True)


def ingest_in_a_thread(item: RequestFacts, source: str, now: datetime) -> IngestOutcome:
    try:
        return ingest_request_records([item], source=source, now=now)
    finally:
        connection.close()  # the thread's own connection


def test_a_record_stored_by_a_concurrent_batch_after_the_check_is_merged_not_duplicated() -> None:
    server = Server.objects.create(name="vllm-cpu", base_url="http://127.0.0.1:18000", block_size=32)
    response = load_json("completion-salt-a-2.json")["response"]
    now = timezone.now()
    request_id = canonical_request_id(response["id"])
    span = RequestFacts(
        server="vllm-cpu",
        request_id=request_id,
        arrived_at=now,
        server_ttft_seconds=0.0129,
        prompt_tokens=response["usage"]["prompt_tokens"],
    )
    with session() as gateway, ThreadPoolExecutor(1) as pool:
        # The gateway's batch has inserted the request but not committed when the span's batch looks.
        gateway.execute(
            "INSERT INTO traffic_requestrecord (server_id, request_id, arrived_at, source, cached_tokens, "
            "trace_id, model, tenant, salt_hash, block_hashes) "
            "VALUES (%s, %s, %s, 'gateway', %s, '', '', '', '', '{}')",
            [server.pk, request_id, now, response["usage"]["prompt_tokens_details"]["cached_tokens"]],
        )
        outcome = pool.submit(ingest_in_a_thread, span, "otlp", now)
        wait_for_a_blocked_insert()  # the span's INSERT waits on the gateway's uncommitted key
        gateway.commit()
        assert outcome.result().stored == 1

    record = RequestRecord.objects.get(request_id=request_id)
    assert (record.source, record.cached_tokens) == ("gateway", 160)
    assert (record.server_ttft_seconds, record.prompt_tokens) == (0.0129, response["usage"]["prompt_tokens"])


def test_two_batches_about_one_request_arriving_seconds_apart_leave_one_record() -> None:
    Server.objects.create(name="vllm-cpu", base_url="http://127.0.0.1:18000", block_size=32)
    now = timezone.now()
    gateway = RequestFacts(server="vllm-cpu", request_id="race", arrived_at=now, cached_tokens=160)
    span = RequestFacts(
        server="vllm-cpu",
        request_id="race",
        arrived_at=now + timedelta(seconds=3),
        server_ttft_seconds=0.0129,
    )
    with session() as blocker, ThreadPoolExecutor(2) as pool:
        # Both batches held at once: without a lock per server, each would find nothing stored
        # near its key and insert, and the request would be stored twice.
        blocker.execute("LOCK TABLE traffic_requestrecord IN SHARE MODE")
        outcomes = [
            pool.submit(ingest_in_a_thread, item, source, now)
            for item, source in ((gateway, "gateway"), (span, "otlp"))
        ]
        wait_for_lock_waits(2)  # one on the table lock, one on the ingest lock
        blocker.rollback()
        assert [outcome.result().stored for outcome in outcomes] == [1, 1]

    record = RequestRecord.objects.get(request_id="race")
    assert (record.cached_tokens, record.server_ttft_seconds) == (160, 0.0129)
