"""What a web process remembers between ingest batches (servers, partition ranges, ingest tokens)
never makes a batch fail or land in the wrong place once the database has changed under it."""

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from cachetools import TTLCache
from django.db import connection
from django.test import Client
from django.utils import timezone

from app.api import services as token_services
from app.api.models import IngestToken
from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.traffic.models import RequestRecord
from app.traffic.services.requests import RequestIn, ingest_request_records

# Committed as in production: the foreign key to the server is checked at commit, and a partition
# cannot be dropped by the transaction that wrote to it.
pytestmark = pytest.mark.django_db(transaction=True)


def record(request_id: str, arrived_at: datetime, server: str = "vllm-0") -> RequestIn:
    return RequestIn(
        server=server, request_id=request_id, arrived_at=arrived_at, source="rest", prompt_tokens=191
    )


def test_a_server_deleted_after_a_batch_is_proposed_anew_by_the_next() -> None:
    deleted = Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=32)
    deleted_pk = deleted.pk  # delete() sets it to None
    now = timezone.now()
    assert ingest_request_records([record("cmpl-1", now)], now=now).stored == 1  # remembered now
    deleted.delete()

    assert ingest_request_records([record("cmpl-2", now)], now=now).stored == 1

    proposed = Server.objects.get(name="vllm-0")
    assert proposed.state == Server.State.PROPOSED
    assert proposed.pk not in (deleted_pk, None)
    assert list(RequestRecord.objects.values_list("server_id", "request_id")) == [(proposed.pk, "cmpl-2")]


@pytest.fixture
def old_day() -> Iterator[datetime]:
    """A partition eight days back, as one past retention is before maintenance drops it."""
    day = (timezone.now() - timedelta(days=8)).replace(hour=0, minute=0, second=0, microsecond=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE traffic_requestrecord_memory_test PARTITION OF traffic_requestrecord "
            "FOR VALUES FROM (%s) TO (%s)",
            [day, day + timedelta(days=1)],
        )
    yield day
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS traffic_requestrecord_memory_test")


def test_a_record_of_a_partition_dropped_after_a_batch_is_rejected_and_the_rest_stored(
    old_day: datetime,
) -> None:
    Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=32)
    now = timezone.now()
    late = old_day + timedelta(hours=12)
    assert ingest_request_records([record("cmpl-old-1", late)], now=now).stored == 1  # ranges remembered
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE traffic_requestrecord_memory_test")

    outcome = ingest_request_records([record("cmpl-old-2", late), record("cmpl-new", now)], now=now)

    assert outcome.stored == 1
    assert outcome.rejected == [(0, "arrived_at: outside the kept window of request records")]
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == ["cmpl-new"]


def test_a_revoked_token_is_refused_once_the_process_no_longer_remembers_it(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    memory: TTLCache[str, IngestToken] = TTLCache(
        maxsize=16, ttl=token_services.TOKEN_MEMORY_SECONDS, timer=lambda: clock[0]
    )
    monkeypatch.setattr(token_services, "_live_tokens", memory)
    Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=32)
    secret = create_ingest_token(name="vllm-0")
    headers = {"Authorization": f"Bearer {secret}"}

    def post() -> int:
        body = [{"server": "vllm-0", "request_id": "cmpl-1", "arrived_at": timezone.now().isoformat()}]
        answer = client.post("/api/v1/requests", body, content_type="application/json", headers=headers)
        return answer.status_code

    assert post() == 200
    IngestToken.objects.update(revoked=True)
    assert post() == 200  # remembered: revoking takes up to TOKEN_MEMORY_SECONDS, as the README says
    clock[0] += token_services.TOKEN_MEMORY_SECONDS

    assert post() == 401
