"""Prefixscope's web processes as deployed (gunicorn.conf.py): a batch goes to an idle process.

An ingest batch is CPU work between database round trips. A process that took a second batch while
busy with one (gunicorn's threaded worker accepts while its threads work) made the two take turns on
its interpreter lock while the other process idled; the default one-thread (sync) worker takes a
connection only when it is idle. The test keeps one process busy for real, with a batch waiting for
a lock a second PostgreSQL session holds, and sees in gunicorn's access log which process answered.
"""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from django.utils import timezone

from app.api.services import create_ingest_token
from app.traffic.services.record_rows import INGEST_LOCK_SPACE
from tests.support.factories import a_server
from tests.support.ports import unused_ports
from tests.support.processes import Web, database_url_for_tests
from tests.support.sessions import session, wait_for_lock_waits

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_BATCHES = 8
ACCESS_LOG = ("--access-logformat", "%(p)s %(U)s %(s)s")  # the answering process's id first


def records(server: str, *request_ids: str) -> list[dict[str, object]]:
    now = timezone.now().isoformat()
    return [{"server": server, "request_id": rid, "arrived_at": now} for rid in request_ids]


def post(web: str, token: str, batch: list[dict[str, object]]) -> httpx.Response:
    return httpx.post(
        f"{web}/api/v1/requests", json=batch, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def answering_processes(log: str) -> list[str]:
    """The process id of each answered ingest batch, in the order they were answered."""
    return [line.split()[0] for line in log.splitlines() if " /api/v1/requests 200" in line]


def test_a_batch_goes_to_an_idle_web_process_while_another_is_busy(tmp_path: Path) -> None:
    busy = a_server(name="busy")
    a_server(name="idle")
    token = create_ingest_token(name="sender")
    (port,) = unused_ports(1)
    web = Web(database_url_for_tests(), tmp_path / "web.log", port, workers=2, options=ACCESS_LOG)
    address = f"http://127.0.0.1:{port}"
    try:
        web.start().wait_listening(port)
        with session() as holder, ThreadPoolExecutor(1) as pool:
            # The lock a batch about `busy` takes first (app/traffic/services/record_rows.py).
            holder.execute("SELECT pg_advisory_lock(%s, %s)", [INGEST_LOCK_SPACE, busy.pk])
            waiting = pool.submit(post, address, token, records("busy", "busy-0"))
            wait_for_lock_waits(1, query="pg_advisory_xact_lock")
            answers = [post(address, token, records("idle", f"idle-{n}")) for n in range(IDLE_BATCHES)]
            holder.execute("SELECT pg_advisory_unlock_all()")
            assert waiting.result().status_code == 200
        log = web.stop()
    finally:
        web.ensure_stopped()

    assert [a.status_code for a in answers] == [200] * IDLE_BATCHES
    *idle, busy_process = answering_processes(log)  # the waiting batch was answered last
    assert len(idle) == IDLE_BATCHES
    assert busy_process not in idle, log[-3000:]  # the busy process took none of them
    assert len(set(idle)) == 1  # all went to the one idle process
