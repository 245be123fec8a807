"""What a server's drop is attributed to: the causes of its first minutes, and a restart only where
the server's KV events start a new epoch (seeds 7, 10 and 12 of the bench opened restarts and a
capacity cut at a template commit's evictions, named by a restart minutes later)."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from app.fleet.models import Server
from app.regressions.attribution import cause_shift, confirmed, kind_at, kind_of, restarted_near
from app.regressions.models import Regression
from app.regressions.series import Minute
from app.traffic.models import KVEvent

pytestmark = pytest.mark.django_db
Kind = Regression.Kind


@pytest.fixture
def server() -> Server:
    return Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", model="tiny")


def change_minute() -> datetime:
    return timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=20)


def store_events(server: Server, epoch: int, since: datetime, minutes: int) -> None:
    """One stored block every ten seconds from `since`, in `epoch` (its sequence from 0)."""
    KVEvent.objects.bulk_create(
        KVEvent(
            server=server,
            epoch=epoch,
            seq=i,
            event_index=0,
            emitted_at=since + timedelta(seconds=10 * i),
            received_at=since + timedelta(seconds=10 * i),
            kind=KVEvent.Kind.STORED,
            block_hash=1000 + i,
        )
        for i in range(minutes * 6)
    )


def minute(at: datetime, **lost: int) -> Minute:
    return Minute(at, requests=60, prompt_tokens=60_000, reused_tokens=60_000 - sum(lost.values()), lost=lost)


def test_a_restart_is_confirmed_where_the_servers_epoch_changed_not_minutes_before(server: Server) -> None:
    changed_at = change_minute()
    store_events(server, 0, changed_at - timedelta(minutes=30), minutes=30)
    store_events(server, 1, changed_at + timedelta(seconds=30), minutes=10)  # restarted 30 s into it
    key = ("server", None, server.pk, "")
    assert restarted_near(server.pk, changed_at)
    assert confirmed(Kind.RESTART, key, [], changed_at=changed_at)
    assert confirmed(Kind.CAPACITY, key, [], changed_at=changed_at)
    # A drop 150 s before the restart (a template commit's evictions) is not the restart's.
    earlier = changed_at - timedelta(minutes=2)
    assert not restarted_near(server.pk, earlier)
    assert not confirmed(Kind.RESTART, key, [], changed_at=earlier)
    assert not confirmed(Kind.CAPACITY, key, [], changed_at=earlier)


def test_a_server_without_events_before_the_change_is_not_confirmed_restarted(server: Server) -> None:
    changed_at = change_minute()
    store_events(server, 3, changed_at, minutes=2)
    assert not restarted_near(server.pk, changed_at)


def test_the_cause_shift_reads_the_first_minutes_after_the_change_not_a_restart_later() -> None:
    changed_at = change_minute()
    before = [minute(changed_at - timedelta(minutes=m)) for m in range(10, 0, -1)]
    after = [
        minute(changed_at, evicted=20_000),
        minute(changed_at + timedelta(minutes=1), evicted=20_000),
        *(minute(changed_at + timedelta(minutes=m), restarted=50_000) for m in range(3, 8)),
    ]
    shift = cause_shift(before, after)
    assert shift["after"] == {"evicted": pytest.approx(1 / 3, abs=1e-3)}
    # A new process's kind, then: opened only if the server's epoch changed at the change (above).
    assert kind_of(shift) in (Kind.CAPACITY, Kind.RESTART)


@pytest.mark.parametrize(("later", "kind"), [("evicted", Kind.CAPACITY), ("restarted", Kind.RESTART)])
def test_a_new_process_that_keeps_evicting_is_a_capacity_drop(later: str, kind: Regression.Kind) -> None:
    changed_at = change_minute()
    before = [minute(changed_at - timedelta(minutes=m)) for m in range(10, 0, -1)]
    first = [minute(changed_at + timedelta(minutes=m), restarted=40_000) for m in range(2)]
    rest = [minute(changed_at + timedelta(minutes=m), **{later: 30_000}) for m in range(2, 9)]
    assert kind_of(cause_shift(before, [*first, *rest])) == kind


def test_a_server_restarted_at_the_change_is_a_new_process_whatever_cause_its_first_minutes_name(
    server: Server,
) -> None:
    """Seed 11: a capacity cut whose first minutes missed mostly as `salt` (prefixes of a salt the
    new cache had not seen): the server's own new epoch names it, not the diagnosis' causes."""
    changed_at = change_minute()
    store_events(server, 0, changed_at - timedelta(minutes=30), minutes=30)
    store_events(server, 1, changed_at + timedelta(seconds=30), minutes=10)
    before = [minute(changed_at - timedelta(minutes=m)) for m in range(10, 0, -1)]
    first = [minute(changed_at + timedelta(minutes=m), salt=20_000, restarted=10_000) for m in range(2)]
    rest = [minute(changed_at + timedelta(minutes=m), evicted=30_000) for m in range(2, 9)]
    shift = cause_shift(before, [*first, *rest])
    assert kind_of(shift) == Kind.SALT_ROTATION
    assert kind_at(("server", None, server.pk, ""), shift, changed_at=changed_at) == Kind.CAPACITY
    elsewhere = changed_at - timedelta(minutes=10)  # no new epoch near: the causes name it
    assert kind_at(("server", None, server.pk, ""), shift, changed_at=elsewhere) == Kind.SALT_ROTATION


MOVED = {"stayed_before": 0.98, "stayed_after": 0.4}
STAYED = {"stayed_before": 0.98, "stayed_after": 0.95}


@pytest.mark.parametrize(
    ("lost", "placed", "kind"),
    [
        ({"routed_elsewhere": 20_000}, MOVED, Kind.ROUTING),
        # Once a server has stored a prefix it was newly sent and evicted it for want of room, its
        # next miss is an eviction: the router that moved the requests is still the cause.
        ({"evicted": 20_000}, MOVED, Kind.ROUTING),
        # Evictions while every template's requests stayed where they were: no routing change.
        ({"evicted": 20_000}, STAYED, Kind.CAPACITY),
        ({"evicted": 20_000}, None, Kind.CAPACITY),
        ({"salt": 20_000}, MOVED, Kind.SALT_ROTATION),
    ],
)
def test_a_fleet_drop_is_a_routing_change_where_the_requests_stopped_landing_where_they_did(
    lost: dict[str, int], placed: dict[str, float] | None, kind: Regression.Kind
) -> None:
    changed_at = change_minute()
    before = [minute(changed_at - timedelta(minutes=m)) for m in range(10, 0, -1)]
    after = [minute(changed_at + timedelta(minutes=m), **lost) for m in range(3)]
    shift = cause_shift(before, after)
    fleet = ("fleet", None, None, "")
    assert kind_at(fleet, shift, changed_at=changed_at, placed=placed) == kind
    assert confirmed(Kind.ROUTING, fleet, after, changed_at=changed_at, placed=placed) == (placed is MOVED)
