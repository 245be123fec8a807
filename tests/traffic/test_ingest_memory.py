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
from app.traffic.services.requests import IngestOutcome, ingest_request_records
from collectors.records import RequestFacts

# Committed as in production: the foreign key to the server is checked at commit, and a partition
# cannot be dropped by the transaction that wrote to it.
pytestmark = pytest.mark.django_db(transaction=True)


def record(request_id: str, arrived_at: datetime, server: str = "vllm-0") -> RequestFacts:
    return RequestFacts(server=server, request_id=request_id, arrived_at=arrived_at, prompt_tokens=191)


def ingest(items: list[RequestFacts], now: datetime) -> IngestOutcome:
    return ingest_request_records(items, source="rest", now=now)


def test_a_server_deleted_after_a_batch_is_proposed_anew_by_the_next() -> None:
    deleted = Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=32)
    deleted_pk = deleted.pk  # delete() sets it to None
    now = timezone.now()
    assert ingest([record("cmpl-1", now)], now).stored == 1  # remembered now
    deleted.delete()

    assert ingest([record("cmpl-2", now)], now).stored == 1

    proposed = Server.objects.get(name="vllm-0")
    assert proposed.state == Server.State.PROPOSED
    assert proposed.pk not in (deleted_pk, None)
    assert list(RequestRecord.objects.values_list("server_id", "request_id")) == [(proposed.pk, "cmpl-2")]


@pytest.fixture
def old_day() -> Iterator[datetime]:
    """A partition eight days back (a sender catching up), made for a record of that day."""
    day = (timezone.now() - timedelta(days=8)).replace(hour=0, minute=0, second=0, microsecond=0)
    yield day
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS traffic_requestrecord_{day:%Y_%b_%d}".lower())


def test_a_record_whose_partition_was_dropped_after_a_batch_gets_it_again_and_is_stored(
    old_day: datetime,
) -> None:
    Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=32)
    now = timezone.now()
    late = old_day + timedelta(hours=12)
    assert ingest([record("cmpl-old-1", late)], now).stored == 1  # its partition made, ranges remembered
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE traffic_requestrecord_{old_day:%Y_%b_%d}".lower())

    outcome = ingest([record("cmpl-old-2", late), record("cmpl-new", now)], now)

    assert (outcome.stored, outcome.rejected) == (2, [])
    assert sorted(RequestRecord.objects.values_list("request_id", flat=True)) == ["cmpl-new", "cmpl-old-2"]


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
    assert post() == 200  # remembered: revoking takes up to TOKEN_MEMORY_SECONDS, as docs/ingest.md says
    clock[0] += token_services.TOKEN_MEMORY_SECONDS

    assert post() == 401
