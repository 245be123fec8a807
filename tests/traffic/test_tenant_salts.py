"""The salts each tenant sent (TenantSalt), kept up by the minute rollups from records ingested through
the real path, and exported as prefixscope_tenant_salts_total: a rotation is a new salt, not a drop."""

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from app.fleet.models import Server
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import TenantSalt
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts
from tests.core.test_own_metrics import samples

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def facts(request_id: str, minutes: float, tenant: str, salt: str | None) -> RequestFacts:
    tokens = list(range(1, 40))
    return RequestFacts(
        request_id=request_id, arrived_at=START + timedelta(minutes=minutes), server="vllm-a", model="m",
        tenant=tenant, prompt_tokens=len(tokens), prompt_token_ids=tokens, cache_salt=salt,
    )  # fmt: skip


@pytest.fixture
def sent() -> None:
    Server.objects.create(name="vllm-a", base_url="http://127.0.0.1:9/a", block_size=16, model="m")
    requests = [
        facts("a1", 1, "acme", "acme-2026"),
        facts("a2", 2, "acme", "acme-2026"),
        facts("g1", 2, "globex", None),
        facts("a3", 7, "acme", "acme-2026-rotated"),
        facts("a4", 8, "acme", "acme-2026"),  # a client still on the old salt: no new one
    ]
    assert ingest_request_records(requests, source="gateway", now=START + timedelta(hours=1)).rejected == []


def salts() -> dict[tuple[str, str], tuple[datetime, datetime]]:
    return {
        (row.tenant, row.salt_hash): (row.first_seen_at, row.last_seen_at) for row in TenantSalt.objects.all()
    }


def test_the_rollups_keep_each_tenants_salts_with_first_and_last_sight(sent: None) -> None:
    refresh_minute_rollups(since=START, until=START + timedelta(minutes=5))
    assert {(tenant, bool(salt)) for tenant, salt in salts()} == {("acme", True), ("globex", False)}

    refresh_minute_rollups(since=START + timedelta(minutes=5), until=START + timedelta(minutes=10))
    first_pass = salts()
    acme = sorted(times for (tenant, _), times in first_pass.items() if tenant == "acme")
    assert acme == [
        (START + timedelta(minutes=1), START + timedelta(minutes=8)),
        (START + timedelta(minutes=7), START + timedelta(minutes=7)),
    ]
    refresh_minute_rollups(since=START, until=START + timedelta(minutes=10))  # a rerun changes nothing
    assert salts() == first_pass


def test_a_rotation_raises_the_tenants_salt_count(sent: None, client: Client) -> None:
    refresh_minute_rollups(since=START, until=START + timedelta(minutes=5))
    before = _salt_counts(client)
    refresh_minute_rollups(since=START + timedelta(minutes=5), until=START + timedelta(minutes=10))
    after = _salt_counts(client)
    assert (before, after) == ({"acme": 1.0, "globex": 1.0}, {"acme": 2.0, "globex": 1.0})


def _salt_counts(client: Client) -> dict[str, float]:
    return {
        dict(labels)["tenant"]: value
        for (name, labels), value in samples(client).items()
        if name == "prefixscope_tenant_salts_total"
    }
