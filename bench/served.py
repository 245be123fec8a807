"""What the ingest benches share: Prefixscope served by gunicorn as in production, and clients posting to it.

The endpoint is measured end to end through HTTP: gunicorn started with the project's
gunicorn.conf.py (its workers and threads) and production settings (DEBUG off), in front of the
bench's throw-away database, and batches posted by `senders` client threads at once, as a fleet's
exporters send: one sender is the latency of a batch, several are the throughput the server reaches.
Bodies are encoded before the clock starts. A 429 is waited out (Retry-After) and the batch sent
again, as OpenTelemetry exporters do, and counted.
"""

import http.client
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.harness import database_url_of, others_cpu, process_cpu
from tests.support.ports import unused_ports

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Batch:
    token: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Posted:
    seconds: float  # wall
    throttled: int  # 429s waited out
    cpu: float  # CPU seconds of the process(es) storing the records (gunicorn's, the writer's)
    database_cpu: float | None  # of the PostgreSQL backends serving them; None: not readable here


@dataclass(frozen=True, slots=True)
class Served:
    """gunicorn serving Prefixscope: where it listens, and the pids of its master and workers."""

    address: tuple[str, int]
    master: int

    def pids(self) -> list[int]:
        return [self.master, *(child.pid for child in psutil.Process(self.master).children(recursive=True))]


@contextmanager
def served(database: str) -> Iterator[Served]:
    """gunicorn serving Prefixscope on the throw-away database until the block ends."""
    (port,) = unused_ports(1)
    env = {
        **os.environ, "DATABASE_URL": database_url_of(database), "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(32), "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
    }  # fmt: skip
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    command = [
        gunicorn, "-c", "gunicorn.conf.py", "--bind", f"127.0.0.1:{port}", "--access-logfile", "/dev/null",
        "app.wsgi:application",
    ]  # fmt: skip
    server = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_ready("127.0.0.1", port, server)
        yield Served(("127.0.0.1", port), server.pid)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _wait_ready(host: str, port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.poll() is None, "gunicorn exited"
        try:
            connection = http.client.HTTPConnection(host, port, timeout=5)
            connection.request("GET", "/healthz", headers={"X-Forwarded-Proto": "https"})
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.2)
    raise TimeoutError("gunicorn did not answer /healthz")


def post_measured(server: Served, path: str, content_type: str, batches: list[Batch], senders: int) -> Posted:
    """`post_all`, with the CPU seconds gunicorn's processes and the PostgreSQL backends serving
    them spent meanwhile."""
    with others_cpu() as database_cpu:
        pids = server.pids()
        before = process_cpu(pids)
        seconds, throttled = post_all(server.address, path, content_type, batches, senders)
        cpu = process_cpu(pids) - before
    return Posted(seconds, throttled, cpu, database_cpu())


def post_all(
    address: tuple[str, int], path: str, content_type: str, batches: list[Batch], senders: int
) -> tuple[float, int]:
    """Post every batch, `senders` at a time, each sender over one connection at a time (opened again
    when the server closes it, as gunicorn's sync worker does after every answer); every answer
    must be 200 (after 429s waited out). Returns the wall seconds and the 429s waited out."""
    shares = [batches[n::senders] for n in range(senders)]
    with ThreadPoolExecutor(senders) as pool:
        started = time.perf_counter()
        throttled = sum(pool.map(lambda share: _send(address, path, content_type, share), shares))
        seconds = time.perf_counter() - started
    return seconds, throttled


def _send(address: tuple[str, int], path: str, content_type: str, batches: list[Batch]) -> int:
    connection = http.client.HTTPConnection(*address, timeout=120)
    throttled = 0
    for batch in batches:
        headers = {
            "Content-Type": content_type, "Authorization": f"Bearer {batch.token}",
            "X-Forwarded-Proto": "https",  # as the TLS proxy in front of it says
        }  # fmt: skip
        while True:
            try:
                connection.request("POST", path, batch.body, headers)
                response = connection.getresponse()
                answer = response.read()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                connection = http.client.HTTPConnection(*address, timeout=120)  # closed by the server: again
                continue
            if response.status != 429:
                break
            throttled += 1
            time.sleep(float(response.getheader("Retry-After") or 1))
        assert response.status == 200, (response.status, answer[:500])
    connection.close()
    return throttled
