"""The Tenants page: each tenant's hit rate and lost tokens over the window in its URL, and the salt
audit, the prefixes tenants share with no salt among it. Traffic stored through the real ingest path
(block hashes computed from the token ids) and diagnosed by the real diagnosis."""

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from app.core.models import Membership
from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import LOST_COLUMNS, RequestDiagnosis
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db

BLOCK = 16
rng = random.Random(3)
SYSTEM = [rng.randrange(1, 50_000) for _ in range(3 * BLOCK)]  # the prompt every tenant starts with
OTHER = [rng.randrange(1, 50_000) for _ in range(3 * BLOCK)]


def facts(
    request_id: str, at: datetime, tenant: str, start: list[int], *, salt: str | None = None
) -> RequestFacts:
    tokens = start + [rng.randrange(1, 50_000) for _ in range(BLOCK + 5)]
    return RequestFacts(
        request_id=request_id,
        arrived_at=at,
        server="vllm-a",
        model="m",
        tenant=tenant,
        template="support",
        prompt_tokens=len(tokens),
        cached_tokens=2 * BLOCK,
        prompt_token_ids=tokens,
        cache_salt=salt,
    )


def record(now: datetime, settings: Any) -> None:
    """acme and globex send the same first block unsalted; initech salts it; umbrella starts
    elsewhere; an acme request of three hours ago sits outside the last hour (diagnosed too). The
    last hour's requests fall in one clock hour, whatever the time (the salt audit's rollup counts a
    first block that two requests sent in the same hour: UnsaltedPrefixTotals in
    app/traffic/models/prefix_sums.py)."""
    settings.PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES = 4 * 60
    Server.objects.create(name="vllm-a", base_url="http://127.0.0.1:9/a", block_size=BLOCK, model="m")
    hour = now.replace(minute=0, second=0, microsecond=0)
    first = hour + timedelta(minutes=5) if now.minute >= 30 else hour - timedelta(minutes=25)
    sent = [
        facts("acme-old", now - timedelta(hours=3), "acme", SYSTEM),
        facts("acme-1", first, "acme", SYSTEM),
        facts("acme-2", first + timedelta(minutes=10), "acme", SYSTEM),
        facts("globex-1", first + timedelta(minutes=5), "globex", SYSTEM),
        facts("initech-1", first + timedelta(minutes=8), "initech", SYSTEM, salt="initech-2026"),
        facts("umbrella-1", first + timedelta(minutes=12), "umbrella", OTHER),
    ]
    assert ingest_request_records(sent, source="gateway", now=now).rejected == []
    diagnose_requests(now=now + timedelta(minutes=2))
    refresh_minute_rollups(since=now - timedelta(hours=4), until=now)


def row_of(html: str, tenant: str) -> str:
    start = html.index(f'?tenant={tenant}"')
    return html[start : html.index("</tr>", start)]


def test_each_tenant_shows_its_hit_rate_and_lost_tokens_over_the_window_in_its_url(
    client: Client, settings: Any
) -> None:
    now = timezone.now()
    record(now, settings)
    client.force_login(fleet_viewer("engineer"))

    hour = client.get(reverse("dashboard:tenants")).content.decode()  # the last hour by default
    acme = RequestDiagnosis.objects.filter(tenant="acme", arrived_at__gte=now - timedelta(hours=1))
    prompt, reused = sum(d.prompt_tokens for d in acme), sum(d.reused_tokens for d in acme)
    lost = sum(getattr(d, column) for d in acme for column in LOST_COLUMNS.values())
    assert lost > 0 and 0 < reused < prompt
    row = row_of(hour, "acme")
    assert f"{100 * reused / prompt:.1f} %" in row and f"{lost:,}" in row
    assert '<td class="num">2</td>' in row  # its two requests of the last hour
    day = client.get(reverse("dashboard:tenants") + "?window=24h").content.decode()
    assert '<td class="num">3</td>' in row_of(day, "acme")  # the one of three hours ago too
    assert 'value="24h" checked' in day


def test_the_salt_audit_lists_a_first_block_two_tenants_sent_without_a_salt(
    client: Client, settings: Any
) -> None:
    now = timezone.now()
    record(now, settings)
    client.force_login(fleet_viewer("engineer"))

    html = client.get(reverse("dashboard:tenants")).content.decode()
    section = html[html.index("Prefixes shared across tenants with no salt") :]
    (shared,) = section.split('<table class="shared-prefixes">')[1].split("<tbody>")[1].split("</tr>")[:-1]
    assert "acme, globex" in shared and "initech" not in shared and "umbrella" not in shared
    assert '<td class="num">3</td>' in shared  # acme's two of the last hour and globex's one
    for server, request_id in (("vllm-a", "acme-2"), ("vllm-a", "globex-1")):  # each tenant's latest
        assert reverse("dashboard:request-detail", args=[server, request_id]) in shared


def test_a_viewer_of_one_tenant_sees_no_prefix_shared_with_another(client: Client, settings: Any) -> None:
    now = timezone.now()
    record(now, settings)
    user = User.objects.create_user("acme-engineer")
    Membership.objects.create(user=user, tenant="acme")
    client.force_login(user)

    html = client.get(reverse("dashboard:tenants")).content.decode()
    assert "None: no two tenants' unsalted requests began with the same block." in html
    assert "globex" not in html
