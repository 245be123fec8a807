"""The salts each tenant sent (TenantSalt), kept up by the minute rollups from records ingested through
the real path, and exported as prefixscope_tenant_salts_total: a rotation is a new salt, not a drop."""

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import TenantSalt
from collectors.records import RequestFacts
from tests.core.test_own_metrics import samples
from tests.support.factories import a_server, facts, ingested

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def sent_by(tenant: str, request_id: str, minutes: float, salt: str | None) -> RequestFacts:
    tokens = list(range(1, 40))
    return facts(
        request_id=request_id,
        arrived_at=START + timedelta(minutes=minutes),
        server="vllm-a",
        model="m",
        tenant=tenant,
        prompt_tokens=len(tokens),
        prompt_token_ids=tokens,
        cache_salt=salt,
    )


@pytest.fixture
def sent() -> None:
    a_server(name="vllm-a", model="m")
    ingested(
        sent_by("acme", "a1", 1, salt="acme-2026"),
        sent_by("acme", "a2", 2, salt="acme-2026"),
        sent_by("globex", "g1", 2, salt=None),
        sent_by("acme", "a3", 7, salt="acme-2026-rotated"),
        sent_by("acme", "a4", 8, salt="acme-2026"),  # a client still on the old salt: no new one
        source="gateway",
        now=START + timedelta(hours=1),
    )


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
