"""A fleet regression is for what no narrower one names: a fleet drop of no named cause made of
servers whose own regressions are open (each paged to its owner already) opens nothing; the same
drop with the rest of the fleet falling too, or with no server regression, opens the fleet's.

The recorded demo (tests/deploy/test_recorded_alerts.py) paged the platform a second time for a
fleet drop made of sim-3's memory cut and `agent`'s fault. Loss minutes written as the rollups
write them, on PostgreSQL; the detection run as beat runs it.
"""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from app.fleet.models import Server
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from app.traffic.models import LossMinute

pytestmark = pytest.mark.django_db
Scope, Kind = Regression.Scope, Regression.Kind
MINUTES = 40
CHANGE = 20  # the minute the fleet's hit rate falls


def now() -> datetime:
    return timezone.now().replace(second=0, microsecond=0)


def write_minutes(server: Server, *, prompt: int, rate_before: float, rate_after: float) -> None:
    """The server's diagnosed minutes: `rate_*` of its prompt tokens reused, the rest lost
    `unexplained` (a cause that names no kind, so the fleet's drop is its own to open). A little
    scatter, as real minutes have."""
    start = now() - timedelta(minutes=MINUTES)
    for n in range(MINUTES):
        rate = (rate_before if n < CHANGE else rate_after) + (0.01 if n % 2 else -0.01)
        reused = round(prompt * rate)
        LossMinute.objects.create(
            server=server, minute=start + timedelta(minutes=n), requests=20, diagnosed=20,
            prompt_tokens=prompt, diagnosed_prompt_tokens=prompt, reused_tokens=reused,
            unexplained_tokens=prompt - reused,
        )  # fmt: skip


def servers() -> tuple[Server, Server]:
    return (
        Server.objects.create(name="vllm-a", base_url="http://vllm-a:8000", model="tiny", block_size=16),
        Server.objects.create(name="vllm-b", base_url="http://vllm-b:8000", model="tiny", block_size=16),
    )


def open_capacity_regression(server: Server) -> None:
    """As the detection opens one on a server whose memory was cut (its KV events a new epoch)."""
    changed = now() - timedelta(minutes=MINUTES - CHANGE)
    Regression.objects.create(
        scope=Scope.SERVER, server=server, metric=Regression.Metric.HIT_RATE, kind=Kind.CAPACITY,
        changed_at=changed, detected_at=changed + timedelta(minutes=2), updated_at=now(),
        rate_before=0.95, rate_after=0.3, rate_now=0.3, requests_before=400, requests_after=400,
        confidence=0.99,
    )  # fmt: skip


def fleet_regressions() -> list[Regression]:
    return list(Regression.objects.filter(scope=Scope.FLEET))


def test_a_fleet_drop_of_one_server_with_its_own_regression_open_is_that_servers() -> None:
    cut, steady = servers()
    write_minutes(cut, prompt=2000, rate_before=0.95, rate_after=0.4)
    write_minutes(steady, prompt=3000, rate_before=0.95, rate_after=0.95)
    open_capacity_regression(cut)
    detect_regressions(now=now())
    assert fleet_regressions() == []


def test_the_same_drop_without_the_servers_regression_is_the_fleets() -> None:
    """The companion that shows the fleet's drop is material: nothing narrower names it."""
    cut, steady = servers()
    write_minutes(cut, prompt=2000, rate_before=0.95, rate_after=0.4)
    write_minutes(steady, prompt=3000, rate_before=0.95, rate_after=0.95)
    detect_regressions(now=now())
    assert [r.kind for r in fleet_regressions()] == [Kind.UNKNOWN]


def test_a_fleet_whose_other_servers_fell_too_opens_its_own() -> None:
    cut, other = servers()
    write_minutes(cut, prompt=2000, rate_before=0.95, rate_after=0.4)
    write_minutes(other, prompt=3000, rate_before=0.95, rate_after=0.7)
    open_capacity_regression(cut)
    detect_regressions(now=now())
    assert [r.kind for r in fleet_regressions()] == [Kind.UNKNOWN]
