"""Several KV-event subscribers share a fleet through advisory-lock leases
(app/traffic/collection/kv_leases.py).

The failover test runs two subscribers as deployed (`manage.py collect_kv_events`) on a simulated
fleet under load and kills one with SIGKILL: no handler, `finally` or flush runs, and what it had
buffered is recovered by the survivor's replay from the stored positions.
"""

import logging
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import pytest

from app.fleet.models import Server
from app.fleet.services import register_server
from app.traffic.collection.kv_leases import Leases, lease_holders, share_of
from app.traffic.collection.processes import LeaseCounts
from app.traffic.models import CollectorProcess, KVEvent, KVGap, KVStream, ResidentBlock
from simulator.fleet import describe
from simulator.server import ServerConfig
from tests.support.processes import Command, Load, database_url_for_tests, wait_until
from tests.support.published import differences, published, resident_after, rows_of
from tests.support.simulated_fleet import local_config, running_fleet

logger = logging.getLogger(__name__)
LEASE_SECONDS = 2.0
SERVERS = 4


@pytest.mark.parametrize(
    ("servers", "subscribers", "share"), [(4, 1, 4), (4, 2, 2), (5, 2, 3), (1, 3, 1), (0, 2, 0), (3, 0, 3)]
)
def test_a_subscriber_holds_at_most_its_share_of_the_servers(
    servers: int, subscribers: int, share: int
) -> None:
    assert share_of(servers, subscribers) == share


@pytest.mark.django_db
def test_a_second_subscriber_gets_the_share_the_first_gives_up_and_all_once_the_first_is_gone() -> None:
    servers = {101, 102, 103, 104}
    first, second = Leases(lease_seconds=1, name="first"), Leases(lease_seconds=1, name="second")
    try:
        first.connect()
        assert first.take_share(servers) == servers  # alone: every server
        second.connect()
        assert second.take_share(servers) == set()  # none free yet
        excess = first.excess(servers)
        assert len(excess) == 2
        first.release(excess)
        assert second.take_share(servers) == excess
        assert first.take_share(servers) == set()  # at its share: it takes nothing back
        holders = lease_holders()
        assert {pk: name == first.name for pk, name in holders.items()} == {
            pk: pk not in excess for pk in servers
        }
        assert first.counts() == LeaseCounts(held=2, taken=4, released=2)
        first.close()  # as a process that stops gives its leases up (a killed one: the test below)
        assert second.take_share(servers) == servers - excess
        assert set(lease_holders().values()) == {second.name}
        assert second.counts() == LeaseCounts(held=4, taken=4)
    finally:
        first.close()
        second.close()


@pytest.mark.django_db
def test_leases_lost_with_a_broken_connection_and_taken_meanwhile_are_counted_lost() -> None:
    servers = {201, 202}
    first, second = Leases(lease_seconds=1, name="first"), Leases(lease_seconds=1, name="second")
    try:
        first.connect()
        assert first.take_share(servers) == servers
        assert first._connection is not None
        first._connection.close()  # its locks end with it, as with a connection that broke
        second.connect()
        # They end when PostgreSQL's backend notices the connection gone, a moment after the close.
        wait_until(lambda: second.take([201], limit=1) == {201}, timeout=10, what="the broken one's locks")
        assert first.connect() == {201}  # 202 is taken again, 201 is second's now
        assert first.counts() == LeaseCounts(held=1, taken=2, lost=1)
    finally:
        first.close()
        second.close()


def reported_leases(pid: int) -> int | None:
    row = CollectorProcess.objects.filter(kind="kv_subscriber", process__endswith=f":{pid}").first()
    if row is None:
        return None
    assert row.leases_held == row.leases_taken - row.leases_released - row.leases_lost
    return row.leases_held


@pytest.fixture
def fleet() -> Iterator[list[ServerConfig]]:
    with running_fleet([local_config(name=f"sim-{i}") for i in range(SERVERS)]) as configs:
        yield configs


def subscriber(log: Path) -> Command:
    return Command(
        database_url_for_tests(), log, "collect_kv_events",
        "--flush-seconds", "0.2", "--rescan-seconds", str(LEASE_SECONDS),
    )  # fmt: skip


def holders_by_process() -> dict[int, int]:
    """Each leased server's id, with the id of the process holding its lease."""
    return {pk: int(name.rsplit(":", 1)[1]) for pk, name in lease_holders().items()}


def stored_kv_rows(server: Server) -> list[tuple[int, int, int, int, int, int | None]]:
    fields = ("epoch", "seq", "event_index", "block_index", "kind", "block_hash")
    return list(KVEvent.objects.filter(server=server).values_list(*fields))


def caught_up(server: Server, last_seq: int) -> bool:
    return KVStream.objects.filter(server=server, last_seq=last_seq).exists()


@pytest.mark.django_db(transaction=True)
def test_a_killed_subscribers_servers_pass_to_the_other_within_a_lease_period_each_event_stored_once(
    fleet: list[ServerConfig], tmp_path: Path
) -> None:
    servers = [register_server(**{k: str(v) for k, v in describe(config).items()}) for config in fleet]
    first, second = subscriber(tmp_path / "kv-1.log").start(), subscriber(tmp_path / "kv-2.log").start()
    assert first.process is not None and second.process is not None
    killed_pid, survivor_pid = first.process.pid, second.process.pid
    try:
        with ExitStack() as loads:
            for config in fleet:
                loads.enter_context(Load(config.base_url, pause_seconds=0.02))
            shared = sorted([killed_pid, survivor_pid] * 2)
            wait_until(
                lambda: sorted(holders_by_process().values()) == shared,
                timeout=60,
                what="the servers to be shared two and two",
            )
            killed = [pk for pk, pid in holders_by_process().items() if pid == killed_pid]
            wait_until(
                lambda: all(KVEvent.objects.filter(server_id=pk).count() > 200 for pk in killed),
                timeout=60,
                what="events of the first subscriber's servers",
            )
            # Its report of its two leases written before it dies: the row the test reads after.
            wait_until(
                lambda: reported_leases(killed_pid) == 2,
                timeout=4 * LEASE_SECONDS,
                what="the first subscriber to report its two leases",
            )
            first.kill()
            killed_at = time.monotonic()
            wait_until(
                lambda: holders_by_process() == {s.pk: survivor_pid for s in servers},
                timeout=2 * LEASE_SECONDS,
                what="the survivor to lease every server",
            )
            handover_seconds = time.monotonic() - killed_at
            # The survivor reports its leases (its row, beside the killed one's, which no longer reports).
            wait_until(
                lambda: reported_leases(survivor_pid) == 4,
                timeout=4 * LEASE_SECONDS,
                what="the survivor to report its four leases",
            )
            time.sleep(2.0)  # load goes on after the handover
        replies = {server.pk: published(str(server.kv_replay_endpoint)) for server in servers}
        for server in servers:
            last_seq = replies[server.pk][-1].seq
            wait_until(partial(caught_up, server, last_seq), timeout=60, what=f"{server.name}'s events")
        log = second.stop()
    finally:
        first.ensure_stopped()
        second.ensure_stopped()

    logger.info(
        "every server leased by the survivor %.2f s after the SIGKILL (lease period %s s)",
        handover_seconds,
        LEASE_SECONDS,
    )
    for server in servers:
        assert differences(stored_kv_rows(server), rows_of(replies[server.pk])) == {}, server.name
        resident = set(ResidentBlock.objects.filter(server=server).values_list("block_hash", flat=True))
        assert resident == resident_after(replies[server.pk]), server.name
    assert not KVGap.objects.filter(lost__gt=0).exists()
    # What was published between the kill and the survivor's subscription came by replay.
    for server in (s for s in servers if s.pk in killed):
        resumed = re.findall(rf"{server.name} rank 0: resumed after seq \d+ of epoch 0, (\d+) batches", log)
        assert resumed and int(resumed[-1]) > 0, server.name
    assert lease_holders() == {}  # a clean stop gives its leases up
    # ... and withdraws its report; the killed one's is left, silent, for /metrics to age out.
    reports = {row.process.rpartition(":")[2]: row for row in CollectorProcess.objects.all()}
    assert set(reports) == {str(killed_pid)}
    assert reports[str(killed_pid)].leases_held == 2
