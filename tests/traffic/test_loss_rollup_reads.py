"""Reads of the loss rollups over a window: whole hours from the hour rollups, the minutes around
them from the minute rollups, the same figures as the minutes alone."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from app.diagnosis.reads import losses, lost_tokens_by_cause, server_funnel
from app.diagnosis.tenants import tenant_audit
from app.fleet.models import Server
from app.rollups.catalog import derived_from
from app.rollups.derived import resum
from app.traffic.models import LossMinute

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOURS = 4


@pytest.fixture
def server() -> Server:
    """Four hours of loss minutes of two tenants on one server (minute n lost n evicted tokens and
    2 salt tokens), and their hours, per-server hours and quarters as the rollup service sums them."""
    server = Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:9/0", block_size=16)
    LossMinute.objects.bulk_create(
        LossMinute(server=server, tenant=tenant, minute=START + timedelta(minutes=n), requests=1, diagnosed=1,
                   prompt_tokens=100, diagnosed_prompt_tokens=100, reused_tokens=50, evicted_tokens=n,
                   salt_tokens=2)
        for n in range(HOURS * 60) for tenant in ("acme", "globex")
    )  # fmt: skip
    with connection.cursor() as cursor:
        for rollup in derived_from(LossMinute):
            resum(rollup, cursor, since=START, until=START + timedelta(hours=HOURS))
    return server


def _figures(server: Server, since: datetime, until: datetime) -> tuple[Any, ...]:
    return (
        lost_tokens_by_cause(since=since, until=until),
        lost_tokens_by_cause(since=since, until=until, tenant="acme"),
        server_funnel(server_id=server.pk, since=since, until=until),
        tenant_audit(since=since, until=until),
        losses(since=since, until=until, by="tenant"),
    )


def test_a_window_of_hours_reads_its_whole_hours_from_the_hour_rollups(server: Server) -> None:
    since, until = START + timedelta(minutes=17, seconds=30), START + timedelta(hours=3, minutes=41)
    minutes = [n for n in range(HOURS * 60) if since <= START + timedelta(minutes=n) < until]
    found = _figures(server, since, until)
    assert found[0]["evicted"] == 2 * sum(minutes) and found[0]["salt"] == 4 * len(minutes)
    assert found[1]["evicted"] == sum(minutes)
    assert found[2]["requests"] == 2 * len(minutes) and found[2]["reused_tokens"] == 100 * len(minutes)
    assert [(row.tenant, row.requests) for row in found[3]] == [
        ("acme", len(minutes)),
        ("globex", len(minutes)),
    ]
    # The minutes of the whole hours (10:00 to 12:00) gone: the same figures, read from the hours.
    LossMinute.objects.filter(
        minute__gte=START + timedelta(hours=1), minute__lt=START + timedelta(hours=3)
    ).delete()
    assert _figures(server, since, until) == found


def test_a_window_inside_one_hour_reads_minutes(server: Server) -> None:
    since, until = START + timedelta(minutes=5), START + timedelta(minutes=50)
    found = lost_tokens_by_cause(since=since, until=until)
    assert found["evicted"] == 2 * sum(range(5, 50))


def test_the_tenant_audit_reads_whole_quarter_hours_from_the_per_server_quarters(server: Server) -> None:
    since, until = START + timedelta(minutes=17, seconds=30), START + timedelta(hours=3, minutes=41)
    found = _figures(server, since, until)
    # The minutes of the whole quarters around the whole hours (09:30 to 10:00, 12:00 to 12:30) gone:
    # the tenant audit's figures read them from the per-server quarters; the per-template reads change.
    for start in (START + timedelta(minutes=30), START + timedelta(hours=3)):
        LossMinute.objects.filter(minute__gte=start, minute__lt=start + timedelta(minutes=30)).delete()
    after = _figures(server, since, until)
    assert after[3] == found[3] and after[0] != found[0]
