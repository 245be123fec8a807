"""Ingest under overload, against the live server: 429 with Retry-After, nothing of the refused batch
stored, the acknowledged batches all stored, and the sender's retry stored exactly once.

A second PostgreSQL session holding a lock that INSERT waits for (and SELECT does not) keeps a batch
in flight for as long as the test needs, so "busy" is real, not mocked.
"""

import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from pytest_django.live_server_helper import LiveServer

from app.api.ingest import admission
from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.traffic.models import RequestRecord
from collectors.otlp.parse import decode_export, span_request
from collectors.records import canonical_request_id
from tests.api.test_ingest import CAPTURES
from tests.api.test_otlp import captured_export
from tests.support.captures import load_json
from tests.support.sessions import inserts_blocked, wait_for_a_blocked_insert

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token() -> Iterator[str]:
    Server.objects.create(name="vllm-cpu", base_url="http://127.0.0.1:18000", block_size=32)
    admission._refused.clear()  # refusals other tests left in this process's memory
    yield create_ingest_token(name="vllm-cpu")


def batch(*names: str) -> list[dict[str, object]]:
    """Records of captured completions, as an application reports them."""
    now = timezone.now().isoformat()
    records = []
    for name in names:
        response = load_json(f"{name}.json")["response"]
        records.append(
            {
                "server": "vllm-cpu",
                "request_id": canonical_request_id(response["id"]),
                "arrived_at": now,
                "usage": response["usage"],
            }
        )
    return records


def post(server: LiveServer, token: str, records: list[dict[str, object]]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/api/v1/requests",
        json=records,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def post_spans(server: LiveServer, token: str, body: bytes) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-protobuf"}
    return httpx.post(f"{server.url}/v1/traces", content=body, headers=headers, timeout=60)


def stored() -> Counter[str]:
    return Counter(RequestRecord.objects.values_list("request_id", flat=True))


def refusals(server: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {
        s.labels["source"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "prefixscope_rejected_inputs_total" and s.labels["reason"] in ("busy", "database_busy")
    }


@override_settings(PREFIXSCOPE_INGEST_CONCURRENCY=1, PREFIXSCOPE_INGEST_WAIT_SECONDS=10)
def test_a_batch_beyond_the_bound_waits_for_a_slot_and_is_stored(live_server: LiveServer, token: str) -> None:
    slot = admission._slots(1)  # the live server runs in this process: the test holds its only slot
    records = batch(*CAPTURES)
    with ThreadPoolExecutor(1) as pool:
        assert slot.acquire(timeout=5)
        try:
            sent = pool.submit(post, live_server, token, records)
            time.sleep(1)
            assert not sent.done()  # neither refused nor stored: waiting for the slot
        finally:
            slot.release()
        answer = sent.result()

    assert answer.json() == {"stored": 4, "rejected": []}
    assert stored() == Counter(r["request_id"] for r in records)
    assert refusals(live_server) == {}


@override_settings(PREFIXSCOPE_INGEST_CONCURRENCY=1, PREFIXSCOPE_INGEST_WAIT_SECONDS=1)
def test_a_batch_beyond_the_bound_is_refused_after_its_wait_and_its_retry_is_stored_once(
    live_server: LiveServer, token: str
) -> None:
    first, second = batch(*CAPTURES[:2]), batch(*CAPTURES[2:])
    spans = captured_export().SerializeToString()
    with inserts_blocked() as lock, ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(post, live_server, token, first)  # takes the only slot, then waits
        wait_for_a_blocked_insert()
        started = time.monotonic()
        refused, refused_spans = post(live_server, token, second), post_spans(live_server, token, spans)
        waited = time.monotonic() - started
        assert stored() == Counter()  # while the first batch waits, nothing is stored
        lock.rollback()
        acknowledged = in_flight.result()

    assert (refused.status_code, refused.headers["Retry-After"]) == (429, "1")
    assert waited >= 2  # each waited its second for the slot first
    assert "retry" in refused.json()["message"]
    assert (refused_spans.status_code, refused_spans.headers["Retry-After"]) == (429, "1")
    assert acknowledged.json() == {"stored": 2, "rejected": []}
    assert stored() == Counter(r["request_id"] for r in first)  # of the refused ones, nothing
    assert refusals(live_server) == {"rest": 1.0, "otlp": 1.0}

    time.sleep(int(refused.headers["Retry-After"]))  # the senders honour Retry-After
    assert post(live_server, token, second).status_code == 200
    assert post(live_server, token, second).status_code == 200  # the answer was lost: sent once more
    assert post_spans(live_server, token, spans).status_code == 200
    span_ids = {r.request_id for r in map(span_request, decode_export(spans, "application/x-protobuf")) if r}
    assert len(span_ids) == 18
    # Each request once: the spans of the REST batches' requests merged into their records.
    assert stored() == Counter({*(r["request_id"] for r in first + second), *span_ids})


@override_settings(PREFIXSCOPE_INGEST_LOCK_TIMEOUT_SECONDS=1)
def test_a_batch_the_database_does_not_take_in_time_is_refused_and_its_retry_stored(
    live_server: LiveServer, token: str
) -> None:
    records = batch(*CAPTURES)
    with inserts_blocked():
        refused = post(live_server, token, records)  # waits a second for the lock, then gives up

    assert (refused.status_code, refused.headers["Retry-After"]) == (429, "1")
    assert "database" in refused.json()["message"]
    assert stored() == Counter()
    assert post(live_server, token, records).json() == {"stored": 4, "rejected": []}
    assert stored() == Counter(r["request_id"] for r in records)
    assert refusals(live_server) == {"rest": 1.0}
