"""The README's run command: the UI comes up, Ctrl-C stops everything, a second start keeps the data."""

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth.hashers import check_password

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_demo_ports() -> int:
    """A base port P with P..P+3, P+10..P+13 and P+20..P+23 free (the demo fleet's ports)."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20000, 60000)
        try:
            with contextlib.ExitStack() as stack:
                for offset in (0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise AssertionError("no free block of demo ports")


def log_tail(data_dir: Path) -> str:
    return "\n".join((data_dir / "run.log").read_text(errors="replace").splitlines()[-40:])


def wait_until_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the run command exited early with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:  # refused, reset or timed out while the processes start
            time.sleep(0.5)
    raise AssertionError(f"{url} was not ready within {timeout} s")


def start(data_dir: Path, port: int, demo_port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["PREFIXSCOPE_DATA_DIR"] = str(data_dir)
    env["PREFIXSCOPE_DEMO_PORT"] = str(demo_port)
    log = (data_dir / "run.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "app.devstack", "run", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal gives it
    )


def press_ctrl_c(process: subprocess.Popen[bytes]) -> int:
    os.killpg(process.pid, signal.SIGINT)  # a terminal sends SIGINT to the whole foreground group
    return process.wait(timeout=60)


def stop_output(data_dir: Path) -> str:
    """What the processes wrote from the last Ctrl-C on."""
    log = (data_dir / "run.log").read_text(errors="replace")
    return log[log.rindex("SIGINT received") :]


def database(data_dir: Path) -> psycopg.Connection:
    return psycopg.connect(host=str(data_dir / "postgres"), dbname="prefixscope", user="postgres")


def wait_for_demo_data(data_dir: Path, timeout: float = 120) -> None:
    """The demo fleet's traffic reaches PostgreSQL: KV events through the collector, /metrics
    through beat and the worker, request records from the fleet's spans through /v1/traces."""
    queries = {
        "KV events": "SELECT count(*) FROM traffic_kvevent",
        "good scrapes": "SELECT count(*) FROM traffic_scrape WHERE ok",
        "request records": "SELECT count(*) FROM traffic_requestrecord WHERE source = 'otlp'",
    }
    deadline = time.monotonic() + timeout
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        with database(data_dir) as conn:
            counts = {name: (conn.execute(sql).fetchone() or (0,))[0] for name, sql in queries.items()}
        if all(counts.values()):
            return
        time.sleep(1)
    raise AssertionError(f"no demo data after {timeout} s: {counts}\n{log_tail(data_dir)}")


@pytest.mark.timeout(600)
def test_run_serves_the_ui_stops_on_ctrl_c_and_restarts_with_its_data(tmp_path: Path) -> None:
    port, demo_port = free_port(), free_demo_ports()
    # Secrets as `make run` generates them, here both beginning with "-" (1 in 64 of generated ones
    # does), which the commands it runs once took for an option and failed on.
    (tmp_path / "admin-password").write_text("-starts-like-an-option")
    (tmp_path / "demo-ingest-token").write_text("-also-starts-like-an-option")
    first = start(tmp_path, port, demo_port)
    try:
        try:
            wait_until_ready(f"http://127.0.0.1:{port}/readyz", first)
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n{log_tail(tmp_path)}") from None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=5) as login_page:
            assert b"Log in" in login_page.read()
        wait_for_demo_data(tmp_path)  # the demo fleet's spans among it: its ingest token was taken
        with database(tmp_path) as conn:
            admin = conn.execute("SELECT password FROM auth_user WHERE username = 'admin'").fetchone()
            assert admin is not None and check_password("-starts-like-an-option", admin[0])
            conn.execute(
                "INSERT INTO fleet_server (name, base_url, metrics_url, kv_events_endpoint,"
                " kv_replay_endpoint, kv_topic, model, hash_algo, tenant, state,"
                " scrape_interval_seconds, created_at)"
                " VALUES ('kept', 'http://x:8000', '', '', '', '', 'tiny', '', '', 'active', 15, now())"
            )
    finally:
        exit_code = press_ctrl_c(first)
    assert exit_code == 0, log_tail(tmp_path)
    # The demo stops before the web process it sends spans to: nothing complains on the way out.
    stopping = stop_output(tmp_path)
    assert "ERROR" not in stopping and "Traceback" not in stopping, stopping
    assert not (tmp_path / "postgres" / "postmaster.pid").exists(), "PostgreSQL was left running"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1)

    second = start(tmp_path, port, demo_port)
    try:
        try:
            wait_until_ready(f"http://127.0.0.1:{port}/readyz", second)
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n{log_tail(tmp_path)}") from None
        with database(tmp_path) as conn:
            names = {name for (name,) in conn.execute("SELECT name FROM fleet_server")}
            assert names == {"kept", "sim-0", "sim-1", "sim-2", "sim-3"}
    finally:
        assert press_ctrl_c(second) == 0, log_tail(tmp_path)
