"""Collectors killed with SIGKILL under load and started again: what they acknowledged is kept.

The collectors run as deployed (`manage.py collect_kv_events`, `manage.py gateway`) against a
simulated server that answers a steady client; SIGKILL leaves them no handler, `finally` or flush.
- The KV collector acknowledges nothing to vLLM: its commit of rows and stream position together is
  its acknowledgement, and replay from the committed position must recover everything after it.
- The gateway acknowledges a record once it is committed or fsynced to its spill file; what is only
  in its queue (at most --queue-size records, plus the batch of at most --batch-size being written)
  is what a SIGKILL can lose.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.fleet.models import Server
from app.fleet.services import register_server
from app.traffic.collection.gateway_writer import read_spill
from app.traffic.models import KVEvent, KVGap, KVStream, RequestRecord, ResidentBlock
from simulator.fleet import describe
from simulator.server import ServerConfig
from tests.support.ports import unused_ports
from tests.support.processes import Command, Load, database_url_for_tests, wait_until
from tests.support.published import differences, published, resident_after, rows_of
from tests.support.simulated_fleet import local_config, running_fleet

pytestmark = pytest.mark.django_db(transaction=True)
UNREACHABLE_DATABASE = "postgres://postgres@%2Fnonexistent%2Fpostgresql/prefixscope"
QUEUE_SIZE, BATCH_SIZE = 40, 10
CAPTURED_ROWS = 95 + 44  # stored blocks plus removed blocks in the capture


@pytest.fixture
def upstream() -> Iterator[ServerConfig]:
    with running_fleet([local_config(name="sim-0")]) as configs:
        yield configs[0]


@pytest.fixture
def server(upstream: ServerConfig) -> Server:
    return register_server(**{key: str(value) for key, value in describe(upstream).items()})


def kv_collector(log: Path) -> Command:
    return Command(
        database_url_for_tests(), log, "collect_kv_events", "--flush-seconds", "0.2", "--rescan-seconds", "1"
    )


def stored_kv_rows(server: Server) -> list[tuple[int, int, int, int, int, int | None]]:
    fields = ("epoch", "seq", "event_index", "block_index", "kind", "block_hash")
    return list(KVEvent.objects.filter(server=server).values_list(*fields))


def test_a_killed_kv_collector_resumes_from_its_committed_position_and_stores_each_event_once(
    upstream: ServerConfig, server: Server, tmp_path: Path
) -> None:
    first = kv_collector(tmp_path / "kv-1.log").start()
    second = kv_collector(tmp_path / "kv-2.log")
    try:
        with Load(upstream.base_url) as load:
            wait_until(lambda: KVEvent.objects.filter(server=server).count() > 200, timeout=60, what="events")
            first.kill()
            answered_at_kill = len(load.answered)
            wait_until(lambda: len(load.answered) > answered_at_kill + 50, timeout=30, what="more load")
        committed = KVStream.objects.get(server=server).last_seq
        published_while_down = published(str(server.kv_replay_endpoint))[-1].seq
        assert published_while_down > committed + 50
        second.start()  # nothing is published now: only its replay from `committed` can catch up
        wait_until(
            lambda: KVStream.objects.get(server=server).last_seq == published_while_down,
            timeout=60,
            what="the restarted collector to replay what it missed",
        )
        with Load(upstream.base_url) as load:
            wait_until(lambda: len(load.answered) > 50, timeout=30, what="load after the restart")
        replies = published(str(server.kv_replay_endpoint))
        wait_until(
            lambda: KVStream.objects.get(server=server).last_seq == replies[-1].seq,
            timeout=30,
            what="the collector to catch up",
        )
        second.stop()
    finally:
        first.ensure_stopped()
        second.ensure_stopped()

    assert differences(stored_kv_rows(server), rows_of(replies)) == {}
    stream = KVStream.objects.get(server=server)
    assert (stream.epoch, stream.last_seq) == (0, replies[-1].seq)  # the position survived the kill
    assert not KVGap.objects.filter(lost__gt=0).exists()
    resident = set(ResidentBlock.objects.filter(server=server).values_list("block_hash", flat=True))
    assert resident == resident_after(replies)


def test_a_killed_gateway_loses_at_most_its_queue_and_what_it_spilled_is_stored_by_the_next(
    upstream: ServerConfig, server: Server, tmp_path: Path
) -> None:
    spill = tmp_path / "gateway.jsonl"
    (port,) = unused_ports(1)
    options = ["--listen", f"127.0.0.1:{port}", "--upstream", upstream.base_url, "--server", "sim-0",
               "--spill-file", str(spill), "--queue-size", str(QUEUE_SIZE), "--batch-size", str(BATCH_SIZE),
               "--flush-seconds", "0.2"]  # fmt: skip
    # The first gateway cannot reach PostgreSQL: what it acknowledges goes to the spill file.
    first = Command(UNREACHABLE_DATABASE, tmp_path / "gateway-1.log", "gateway", *options).start()
    second = Command(database_url_for_tests(), tmp_path / "gateway-2.log", "gateway", *options)
    try:
        first.wait_listening(port)
        with Load(f"http://127.0.0.1:{port}") as load:
            wait_until(lambda: spill.exists() and len(read_spill(spill)[0]) >= 100, timeout=60, what="spills")
            first.kill()
            answered_by_first = set(load.answered)
        spilled, _ = read_spill(spill)  # a line torn by the kill is counted, not read
        second.start()
        second.wait_listening(port)
        with Load(f"http://127.0.0.1:{port}") as load:
            wait_until(lambda: len(load.answered) >= 50, timeout=30, what="load on the second gateway")
        answered_by_second = set(load.answered)
        wait_until(lambda: not spill.exists(), timeout=30, what="the spill file to be replayed")
        second.stop()
    finally:
        first.ensure_stopped()
        second.ensure_stopped()

    stored = list(RequestRecord.objects.filter(server=server).values_list("request_id", flat=True))
    assert len(stored) == len(set(stored))
    assert {item.request_id for item in spilled} <= set(stored)  # acknowledged to the spill file: kept
    assert answered_by_second <= set(stored)
    lost = answered_by_first - set(stored)
    assert len(lost) <= QUEUE_SIZE + BATCH_SIZE, f"{len(lost)} records lost"
    assert set(stored) <= answered_by_first | answered_by_second
