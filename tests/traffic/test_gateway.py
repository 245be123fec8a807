"""The gateway storing what passes: real sockets, a simulated vLLM server, the writer, real PostgreSQL.

The writer thread has its own database connection, so these tests commit (transaction=True). The
outage is a real one for the writer: its connection is pointed at a local port nothing listens on,
then back; the shared PostgreSQL keeps running.
"""

import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from app.domain.blockhash import block_hash_chain, wire_to_signed
from app.fleet.models import Server
from app.prompts.models import TemplateVersion
from app.traffic.collection.gateway_writer import QUEUE_FULL, GatewayWriter, WriterPool, read_spill
from app.traffic.models import RejectedInput, RequestRecord
from app.traffic.services.requests import IngestOutcome, ingest_request_records
from collectors.records import RequestFacts, canonical_request_id
from simulator.server import ServerConfig
from tests.support.captures import captured_traffic
from tests.support.factories import a_server
from tests.support.ports import unused_ports
from tests.support.running_gateway import call, running_gateway, wait_for
from tests.support.simulated_fleet import local_config, running_fleet

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def upstream() -> Iterator[ServerConfig]:
    with running_fleet([local_config()]) as configs:
        yield configs[0]


@pytest.fixture
def server(upstream: ServerConfig) -> Server:
    return Server.objects.create(name="sim-0", base_url=upstream.base_url, block_size=32, model="tiny")


@pytest.fixture
def spill(tmp_path: Path) -> Path:
    return tmp_path / "spill" / "gateway.jsonl"


def writer_for(server: str, spill: Path, **options: Any) -> GatewayWriter:
    return GatewayWriter(server=server, spill_path=spill, flush_seconds=0.05, retry_seconds=0.2, **options)


def complete(gateway: str, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    """Send one completion through the gateway; the answer the client saw (a stream's usage chunk),
    with `request_id`, the canonical id its record is stored under."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    answer = call("POST", gateway + path, body, {"Content-Type": "application/json", **headers})
    assert answer.status == 200, answer.body
    if not body.get("stream"):
        found = dict(json.loads(answer.body))
    else:
        chunks = [json.loads(e[6:]) for e in answer.body.split(b"\n\n") if e.startswith(b"data: {")]
        found = {"id": chunks[0]["id"], "usage": next((c["usage"] for c in chunks if c.get("usage")), None)}
    return found | {"request_id": canonical_request_id(found["id"])}


def as_an_application_sends_it(body: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in body.items() if key != "return_token_ids"}


def test_captured_traffic_is_stored_with_the_cached_tokens_its_clients_saw(
    upstream: ServerConfig, server: Server, spill: Path
) -> None:
    writer = writer_for("sim-0", spill)
    writer.start()
    seen = {}
    with running_gateway(upstream.base_url, writer) as gateway:
        for body, cached in captured_traffic():
            answer = complete(gateway, as_an_application_sends_it(body))
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == cached  # as vLLM reported
            seen[answer["request_id"]] = (answer["usage"], body)
    writer.stop()
    records = {r.request_id: r for r in RequestRecord.objects.filter(server=server)}
    assert records.keys() == seen.keys() and len(records) == len(captured_traffic())
    for request_id, (usage, body) in seen.items():
        record = records[request_id]
        assert record.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]
        assert (record.prompt_tokens, record.completion_tokens) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        assert record.source == RequestRecord.Source.GATEWAY and record.client_ttft_seconds is not None
        assert record.token_ids is not None and len(record.token_ids) == usage["prompt_tokens"]
        salt = body.get("cache_salt")
        chain = block_hash_chain(record.token_ids, 32, cache_salt=salt if isinstance(salt, str) else None)
        assert record.block_hashes == [wire_to_signed(h.wire) for h in chain]
        assert record.salt_hash == (
            hashlib.sha256(salt.encode()).hexdigest() if isinstance(salt, str) else ""
        )
    assert sum(r.cached_tokens or 0 for r in records.values()) == sum(c for _, c in captured_traffic())
    assert writer.stored == len(seen) and writer.spilled == writer.dropped == 0 and not spill.exists()


def test_the_headers_name_tenant_template_version_and_trace(
    upstream: ServerConfig, server: Server, spill: Path
) -> None:
    writer = writer_for("sim-0", spill)
    writer.start()
    headers = {
        "X-Prefixscope-Tenant": "acme",
        "X-Prefixscope-Template": "support-bot",
        "X-Prefixscope-Template-Version": "9b1c2d3e4f",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    body = {"model": "tiny", "prompt": "Policy one: never reveal internal ticket numbers.", "max_tokens": 2}
    with running_gateway(upstream.base_url, writer) as gateway:
        answer = complete(gateway, {**body, "stream": True}, **headers)
    writer.stop()
    record = RequestRecord.objects.select_related("template", "template_version").get(
        request_id=answer["request_id"]
    )
    assert (record.tenant, record.trace_id) == ("acme", "4bf92f3577b34da6a3ce929d0e0e4736")
    assert record.template is not None and record.template.name == "support-bot"
    assert record.template_version == TemplateVersion.objects.get(commit_sha="9b1c2d3e4f")
    assert (
        record.cached_tokens == 0
        and record.client_ttft_seconds is not None
        and record.client_ttft_seconds > 0
    )


def test_a_chat_request_is_stored_with_its_parts_digests_and_never_their_text(
    upstream: ServerConfig, server: Server, spill: Path
) -> None:
    writer = writer_for("sim-0", spill)
    writer.start()
    tool = {"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}
    body = {
        "model": "tiny", "max_tokens": 2, "tools": [tool],
        "chat_template_kwargs": {"reasoning_effort": "high"},
        "messages": [{"role": "system", "content": "Support desk rules."}, {"role": "user", "content": "Hi"}],
    }  # fmt: skip
    with running_gateway(upstream.base_url, writer) as gateway:
        chat = complete(gateway, body)
        text = complete(gateway, {"model": "tiny", "prompt": "Support desk rules.", "max_tokens": 2})
    writer.stop()
    stored = RequestRecord.objects.get(request_id=chat["request_id"]).part_digests
    assert stored is not None and set(stored) >= {"system", "tools", "tools_sent", "reasoning_effort"}
    assert stored["latest"] == 1 and len(stored["messages"]) == 1
    assert not any(word in json.dumps(stored) for word in ("Support", "lookup_order", "high", "Hi"))
    assert RequestRecord.objects.get(request_id=text["request_id"]).part_digests is None


def test_an_unregistered_upstream_is_proposed_as_a_server(upstream: ServerConfig, spill: Path) -> None:
    writer = writer_for(upstream.base_url, spill)
    writer.start()
    with running_gateway(upstream.base_url, writer) as gateway:
        answer = complete(gateway, {"model": "tiny", "prompt": "hello", "max_tokens": 1})
    writer.stop()
    record = RequestRecord.objects.select_related("server").get(request_id=answer["request_id"])
    assert record.server.state == Server.State.PROPOSED and record.server.base_url == upstream.base_url


def test_a_full_queue_drops_and_counts_records_and_never_holds_a_request_back(
    upstream: ServerConfig, server: Server, spill: Path
) -> None:
    writer = writer_for("sim-0", spill, capacity=2)  # not started yet: nothing takes records off the queue
    with running_gateway(upstream.base_url, writer) as gateway:
        ids = [
            complete(gateway, {"model": "tiny", "prompt": f"request {i}", "max_tokens": 1})["request_id"]
            for i in range(5)
        ]
        wait_for(lambda: writer.dropped == 3)
    writer.start()
    writer.stop()
    assert set(RequestRecord.objects.values_list("request_id", flat=True)) == set(ids[:2])
    rejected = RejectedInput.objects.get(source="gateway", reason=QUEUE_FULL.code)
    assert rejected.count == 3 and rejected.server == server and writer.dropped == 3


class Outage:
    """`store` for the writer: ingest_request_records on a connection that, while `down` is set,
    points at a local port nothing listens on (psycopg's connection is refused: OperationalError)."""

    def __init__(self) -> None:
        self.down = threading.Event()
        (self.port,) = unused_ports(1)
        self.original: dict[str, Any] | None = None
        self.refused = 0

    def store(self, items: Sequence[RequestFacts], **options: Any) -> IngestOutcome:
        if self.original is None:
            self.original = connection.settings_dict
        wanted = (
            {**self.original, "HOST": "127.0.0.1", "PORT": self.port} if self.down.is_set() else self.original
        )
        if connection.settings_dict != wanted:
            connection.close()
            connection.settings_dict = wanted
        try:
            return ingest_request_records(items, **options)
        except Exception:
            self.refused += 1
            raise


def test_records_spill_while_postgresql_is_down_and_are_replayed_once_it_is_back(
    upstream: ServerConfig, server: Server, spill: Path
) -> None:
    outage = Outage()
    writer = writer_for("sim-0", spill, store=outage.store)
    writer.start()
    body = {"model": "tiny", "prompt": "Follow the policies below exactly.", "max_tokens": 2}
    with running_gateway(upstream.base_url, writer) as gateway:
        before = complete(gateway, body)["request_id"]
        wait_for(lambda: writer.stored == 1)
        outage.down.set()
        during = [
            complete(gateway, {**body, "stream": i % 2 == 1})["request_id"] for i in range(12)
        ]  # all answered
        wait_for(lambda: writer.spilled == 12)
        assert outage.refused >= 1 and RequestRecord.objects.count() == 1
        spilled, unreadable = read_spill(spill)
        assert sorted(item.request_id for item in spilled) == sorted(during) and unreadable == 0
        assert stat.S_IMODE(spill.stat().st_mode) == 0o600  # it holds salts and prompt token ids
        outage.down.clear()
        wait_for(lambda: not spill.exists())
        after = complete(gateway, body)["request_id"]
    writer.stop()
    stored = set(RequestRecord.objects.values_list("request_id", flat=True))
    assert stored == {before, *during, after}
    assert all(r.cached_tokens is not None for r in RequestRecord.objects.all())


def test_what_a_stopped_gateway_spilled_is_replayed_by_the_next_one(
    upstream: ServerConfig, server: Server, spill: Path
) -> None:
    outage = Outage()
    outage.down.set()
    first = writer_for("sim-0", spill, store=outage.store)
    first.start()
    with running_gateway(upstream.base_url, first) as gateway:
        ids = [
            complete(gateway, {"model": "tiny", "prompt": f"p {i}", "max_tokens": 1})["request_id"]
            for i in range(5)
        ]
    first.stop()  # drained into the spill file: the database is still down
    assert first.spilled == 5 and len(read_spill(spill)[0]) == 5
    second = writer_for("sim-0", spill)
    second.start()
    wait_for(lambda: not spill.exists())
    second.stop()
    assert set(RequestRecord.objects.values_list("request_id", flat=True)) == set(ids)


def test_a_line_torn_by_a_crash_costs_that_line_only(server: Server, spill: Path) -> None:
    outage = Outage()
    outage.down.set()
    writer = writer_for("sim-0", spill, store=outage.store)
    arrived = timezone.now()
    observed = RequestFacts(request_id="2", arrived_at=arrived, client_ttft_seconds=0.01, cached_tokens=0)
    spill.parent.mkdir(parents=True)
    spill.write_text(
        json.dumps({"server": "sim-0", "request_id": "1", "arrived_at": arrived.isoformat()})
        + "\n"
        + '{"server": "sim-0", "requ'
    )
    writer.start()
    writer.record(observed)
    wait_for(lambda: writer.spilled == 1)
    assert read_spill(spill)[1] == 1  # the torn line, alone on its line
    outage.down.clear()
    wait_for(lambda: not spill.exists())
    writer.stop()
    assert set(RequestRecord.objects.values_list("request_id", flat=True)) == {"1", "2"}
    assert (
        RejectedInput.objects.get(reason="spill_unreadable", detail="spill file: unreadable line").count == 1
    )


def test_the_command_refuses_an_unknown_server_and_a_bad_address() -> None:
    with pytest.raises(CommandError, match="no server has this name"):
        call_command(
            "gateway", "--listen", "127.0.0.1:9000", "--upstream", "http://vllm:8000", "--server", "nope"
        )
    with pytest.raises(CommandError, match="expected host:port"):
        call_command("gateway", "--listen", "9000", "--upstream", "http://vllm:8000")
    with pytest.raises(CommandError, match="http"):
        call_command("gateway", "--listen", "127.0.0.1:9000", "--upstream", "vllm:8000")


def test_the_command_proxies_records_and_drains_on_sigterm(
    upstream: ServerConfig, server: Server, tmp_path: Path
) -> None:
    (port,) = unused_ports(1)
    database = settings.DATABASES["default"]["NAME"]  # the test database
    parts = urlsplit(os.environ["DATABASE_URL"])
    environment = {**os.environ, "DATABASE_URL": urlunsplit(parts._replace(path=f"/{database}"))}
    listen, spill_file = f"127.0.0.1:{port}", str(tmp_path / "spill.jsonl")
    command = [sys.executable, "manage.py", "gateway", "--listen", listen, "--upstream", upstream.base_url,
               "--server", "sim-0", "--spill-file", spill_file]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: _listening(port), timeout=30)
        ids = [
            complete(f"http://127.0.0.1:{port}", {"model": "tiny", "prompt": f"p {i}", "max_tokens": 1})[
                "request_id"
            ]
            for i in range(3)
        ]
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert b"3 records stored, 0 spilled, 0 dropped" in out
    assert set(RequestRecord.objects.filter(server=server).values_list("request_id", flat=True)) == set(ids)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_gateway_of_forty_servers_writes_on_its_few_connections_and_stores_every_record_once(
    upstream: ServerConfig, tmp_path: Path
) -> None:
    servers = [
        Server.objects.create(
            name=f"fleet-{i:02}", base_url=f"http://fleet-{i:02}:8000", block_size=32, model="tiny"
        )
        for i in range(40)
    ]
    ports = unused_ports(len(servers))
    database = settings.DATABASES["default"]["NAME"]
    parts = urlsplit(os.environ["DATABASE_URL"])
    environment = {
        **os.environ,
        "DATABASE_URL": urlunsplit(parts._replace(path=f"/{database}")),
        "PREFIXSCOPE_DATA_DIR": str(tmp_path),  # the spill files' folder
    }
    command = [sys.executable, "manage.py", "gateway", "--connections", "3", "--flush-seconds", "0.05"]
    for server, port in zip(servers, ports, strict=True):  # every route to the one simulated vLLM
        command += ["--listen", f"127.0.0.1:{port}", "--upstream", upstream.base_url, "--server", server.name]
    process = subprocess.Popen(
        command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    name = f"prefixscope-gateway:{socket.gethostname()[:24]}:{process.pid}"
    held: list[int] = []
    try:
        wait_for(lambda: all(_listening(port) for port in ports), timeout=60)
        sent = {}
        for round_ in range(3):
            for server, port in zip(servers, ports, strict=True):
                body = {"model": "tiny", "prompt": f"{server.name} request {round_}", "max_tokens": 1}
                sent[complete(f"http://127.0.0.1:{port}", body)["request_id"]] = server.name
            held.append(_connections_named(name))
        wait_for(lambda: RequestRecord.objects.count() == len(sent), timeout=30)
        held.append(_connections_named(name))
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    # The pool's three connections, each kept for its share of the servers: not one per server.
    assert max(held) == 3 and held[-1] == 3, held
    stored = RequestRecord.objects.values_list("request_id", "server__name")
    assert sorted(stored) == sorted(sent.items()) and len(sent) == 3 * len(servers)
    assert out.count(b"3 records stored, 0 spilled, 0 dropped") == len(servers)
    assert not list((tmp_path / "gateway").glob("*.jsonl"))


def _connections_named(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name]
        )
        (count,) = cursor.fetchone()
    return int(count)


def test_writers_sharing_a_connection_spill_together_while_it_is_down_and_each_replays_its_own(
    tmp_path: Path,
) -> None:
    servers = [a_server(name=f"pool-{i}", block_size=32) for i in range(3)]
    outage = Outage()
    writers = [
        writer_for(server.name, tmp_path / f"{server.name}.jsonl", store=outage.store) for server in servers
    ]
    pool = WriterPool(writers, connections=1)
    assert pool.connections == 1 and len({id(writer.link) for writer in writers}) == 1
    pool.start()
    now = timezone.now()

    def send(batch: str) -> set[tuple[str, str]]:
        sent = set()
        for writer in writers:
            for i in range(4):
                request_id = f"{writer.server}-{batch}-{i}"
                writer.record(RequestFacts(request_id=request_id, arrived_at=now, cached_tokens=0))
                sent.add((request_id, writer.server))
        return sent

    sent = send("before")
    wait_for(lambda: sum(writer.stored for writer in writers) == 12)
    outage.down.set()
    sent |= send("during")
    wait_for(lambda: all(writer.spilled == 4 for writer in writers))
    for writer in writers:  # each server's records in its own spill file
        assert {item.request_id for item in read_spill(writer.spill_path)[0]} == {
            f"{writer.server}-during-{i}" for i in range(4)
        }
    outage.down.clear()
    wait_for(lambda: not any(writer.spill_path.exists() for writer in writers))
    sent |= send("after")
    pool.stop()
    stored = RequestRecord.objects.values_list("request_id", "server__name")
    assert sorted(stored) == sorted(sent) and len(sent) == 36
