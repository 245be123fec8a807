"""Prefixscope's long-running commands as subprocesses (stopped, killed and restarted by fault tests),
and a client that keeps completions flowing while they are.

The commands run as in production: `manage.py <command>` (gunicorn for the web) in their own
process, with DATABASE_URL naming the database the test reads. Their output goes to a log file
that a failing test shows.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from collectors.records import canonical_request_id

REPO = Path(__file__).resolve().parents[2]


def database_url_for_tests() -> str:
    """DATABASE_URL naming pytest-django's test database (the commands must write where tests read)."""
    from django.conf import settings

    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path=f"/{settings.DATABASES['default']['NAME']}"))


def manage(database_url: str, *args: str) -> str:
    """Run a short `manage.py` command to its end; its output (a failure shows it)."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


class Command:
    """A long-running `manage.py` command in its own process (started by `start`)."""

    def __init__(self, database_url: str, log: Path, *args: str, environment: dict[str, str] | None = None):
        self.args = args
        self.environment = {**os.environ, "DATABASE_URL": database_url, **(environment or {})}
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> "Command":
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", *self.args],
                cwd=REPO,
                env=self.environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def wait_listening(self, port: int, timeout: float = 60) -> None:
        """Wait until the command accepts connections on `port`; fail with its log if it exits first."""
        assert self.process is not None
        process = self.process
        wait_until(
            lambda: listening(port) or process.poll() is not None, timeout=timeout, what=f"{self.args}"
        )
        assert process.poll() is None, f"manage.py {self.args[0]} exited:\n{self.output()[-4000:]}"

    def kill(self) -> None:
        """SIGKILL: no signal handler, no `finally`, no flush runs."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 30) -> str:
        """SIGTERM, wait for a clean exit, and return the log (asserting the exit was clean)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout)
        output = self.output()
        assert self.process.returncode == 0, (
            f"manage.py {self.args[0]} exited {self.process.returncode}:\n{output}"
        )
        return output

    def ensure_stopped(self) -> None:
        """For `finally`: whatever state the test left it in, the process is gone afterwards."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Web(Command):
    """gunicorn with Prefixscope's configuration (gunicorn.conf.py), as `make run` and the image start it;
    `workers` processes, and `options` added to its command line."""

    def __init__(
        self, database_url: str, log: Path, port: int, *, workers: int = 1, options: tuple[str, ...] = ()
    ) -> None:
        environment = {"PREFIXSCOPE_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": str(workers)}
        super().__init__(database_url, log, "web", environment=environment)
        self.options = options

    def start(self) -> "Web":
        with self.log.open("ab") as log:
            gunicorn = [str(Path(sys.executable).parent / "gunicorn"), "-c", "gunicorn.conf.py"]
            self.process = subprocess.Popen(
                [*gunicorn, *self.options, "app.wsgi:application"],
                cwd=REPO,
                env=self.environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll `condition` until it holds; fail naming `what` when it still does not after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def prompt(number: int) -> str:
    """One of six system prompts (60 to 200 tokens) and a question: shared prefixes, hits and evictions."""
    system = f"System prompt {number % 6}: follow the support policy. " + "Be brief and exact. " * (
        10 + 6 * (number % 6)
    )
    return f"{system}\nQuestion {number}: what does the red light mean?"


class Load:
    """Completions sent one after another from a background thread until `stop`.

    `answered` holds the canonical id of every completion a client got (status 200); `failed` the
    rest.
    """

    def __init__(self, base_url: str, *, pause_seconds: float = 0.01) -> None:
        self.base_url = base_url
        self.pause_seconds = pause_seconds
        self.answered: list[str] = []
        self.failed: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            number = 0
            while not self._stopping.is_set():
                body = {"model": "tiny", "prompt": prompt(number), "max_tokens": 2}
                try:
                    answer = client.post(f"{self.base_url}/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    self.failed.append(repr(exc))
                else:
                    if answer.status_code == 200:
                        self.answered.append(canonical_request_id(answer.json()["id"]))
                    else:
                        self.failed.append(f"{answer.status_code}: {answer.text[:200]}")
                number += 1
                time.sleep(self.pause_seconds)
