"""`make run`'s Prometheus: a real one scraping the stack and evaluating deploy/prometheus/rules as
shipped, and a watcher that prints one console line when an alert starts firing and one when it
resolves (the demo's faults page their owners through the same path a real deployment uses).

    python -m app.devprometheus watch --url http://127.0.0.1:9090   # the watcher, as `make run` runs it

Each run starts a fresh Prometheus (its storage is wiped): the rules must hold from a cold start.
Runs before Django is configured, so it imports no Django.
"""

import argparse
import contextlib
import http.client
import json
import logging
import shutil
import socket
import sys
import threading
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import yaml

from app.debian import apt_install, can_install
from app.env import env_int

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rules"
INTERVAL = "15s"
POLL_SECONDS = 15.0
# Who an alert pages (deploy/alertmanager/alertmanager.yml): `info` is a notice, never a page.
NOTICE_SEVERITIES = frozenset({"info"})
PAGE_SEVERITIES = frozenset({"warning", "critical"})
# The labels that say where an alert is, in the order the line names them; `instance` only when none
# of them is set (vLLM's own metrics name a server `instance`, Prefixscope's `server`).
WHERE_LABELS = ("template", "tenant", "server", "name", "process", "source", "reason")
log = logging.getLogger("app.devprometheus")


def rule_files() -> list[Path]:
    """The repository's alert rule files, absolute paths, as shipped."""
    return sorted(RULES.glob("*.yml"))


def prometheus_config(
    *,
    web: str,
    vllm: Sequence[str],
    rules: Sequence[Path],
    token_file: Path | None = None,
    interval: str = INTERVAL,
) -> dict[str, Any]:
    """A Prometheus configuration: job `prefixscope` scraping the web process at `web` (host:port;
    with `token_file`, sending its content as a bearer token, as deploy/prometheus/scrape-with-token.yml
    does), job `vllm` the servers `vllm` (none: no job), scraped and evaluated every `interval`."""
    prefixscope: dict[str, Any] = {
        "job_name": "prefixscope",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [web]}],
    }
    if token_file is not None:
        prefixscope["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    jobs = [prefixscope]
    if vllm:
        jobs.append(
            {"job_name": "vllm", "metrics_path": "/metrics", "static_configs": [{"targets": list(vllm)}]}
        )
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path.resolve()) for path in rules],
        "scrape_configs": jobs,
    }


@dataclass(frozen=True, slots=True)
class Setup:
    """What `make run` adds for Prometheus: its processes (none without it) and the banner's line."""

    processes: dict[str, str]
    notice: str


def setup(
    *, folder: Path, web_port: int, vllm_ports: Sequence[int], env: dict[str, str], log: TextIO
) -> Setup:
    """Write `folder`/prometheus.yml (the web process on `web_port`, the demo servers on `vllm_ports`),
    wipe the storage of the run before, and return the commands of Prometheus and its watcher. Without
    Prometheus (not installed and not installable) or with its port taken: no process, and a notice."""
    port = env_int("PREFIXSCOPE_PROMETHEUS_PORT", 9090, minimum=1)
    binary = find_or_install(log)
    if binary is None:
        return Setup({}, "Prometheus: not installed (Debian package `prometheus`): running without it.")
    if not _bindable(port):
        return Setup(
            {}, f"Prometheus: port {port} is taken (PREFIXSCOPE_PROMETHEUS_PORT): running without it."
        )
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / "data", ignore_errors=True)
    token_file = _token_file(folder, env.get("PREFIXSCOPE_METRICS_BEARER_TOKEN", "").strip())
    config = prometheus_config(
        web=f"127.0.0.1:{web_port}",
        vllm=[f"127.0.0.1:{vllm}" for vllm in vllm_ports],
        rules=rule_files(),
        token_file=token_file,
    )
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    url = f"http://127.0.0.1:{port}"
    return Setup(
        {
            "prometheus": f"{binary} --config.file={folder / 'prometheus.yml'} "
            f"--storage.tsdb.path={folder / 'data'} --web.listen-address=127.0.0.1:{port}",
            "alerts": f"{sys.executable} -m app.devprometheus watch --url {url}",
        },
        f"Prometheus: {url}/alerts  (rules of deploy/prometheus/rules; alerts firing and resolved show here)",
    )


def _token_file(folder: Path, token: str) -> Path | None:
    """The metrics bearer token in a file only its owner reads (Prometheus reads it at each scrape)."""
    path = folder / "metrics-token"
    path.unlink(missing_ok=True)
    if not token:
        return None
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return path


def find_or_install(log: TextIO) -> str | None:
    """Prometheus' path; when missing, installed as the test command installs Debian packages (as
    root, apt-get; its output to `log`); None when it cannot be."""
    found = shutil.which("prometheus")
    if found or not can_install():
        return found
    print("Installing prometheus (Debian package)...", flush=True)
    return shutil.which("prometheus") if apt_install(["prometheus"], output=log) else None


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True, slots=True, order=True)
class Alert:
    """One alert of /api/v1/alerts, named by its labels (`alertname` among them)."""

    labels: tuple[tuple[str, str], ...]

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")


def firing_alerts(answer: object) -> frozenset[Alert]:
    """The firing alerts of an /api/v1/alerts answer (pending ones are not firing yet). Raises
    ValueError when `answer` is not a successful one."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise ValueError("not a successful /api/v1/alerts answer")
    try:
        return frozenset(
            Alert(tuple(sorted((str(k), str(v)) for k, v in alert["labels"].items())))
            for alert in answer["data"]["alerts"]
            if alert["state"] == "firing"
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not an /api/v1/alerts answer: {exc!r}") from exc


def alert_line(alert: Alert, event: str) -> str:
    """`alert <event>: <name>  owner=<owner_kind>/<owner>  <where>=<value> ...  (page|notice)`."""
    where: dict[str, str] = {}  # value -> label: a regression's `name` is its template or server
    for name in WHERE_LABELS:
        where.setdefault(alert.label(name), name)
    where.pop("", None)
    if not where and alert.label("instance"):
        where[alert.label("instance")] = "instance"
    shown = [f"{name}={value}" for value, name in where.items()]
    owner = f"owner={alert.label('owner_kind') or '?'}/{alert.label('owner') or '?'}"
    return "  ".join([f"alert {event}: {alert.label('alertname')}", owner, *shown, f"({_kind(alert)})"])


def _kind(alert: Alert) -> str:
    severity = alert.label("severity")
    if severity in PAGE_SEVERITIES:
        return "page"
    if severity in NOTICE_SEVERITIES:
        return "notice"
    return f"severity={severity or 'none'}"


def transitions(before: frozenset[Alert], now: frozenset[Alert]) -> list[str]:
    """The lines of what changed from `before` to `now`: alerts firing, then alerts resolved."""
    return [alert_line(alert, "firing") for alert in sorted(now - before)] + [
        alert_line(alert, "resolved") for alert in sorted(before - now)
    ]


def fetch_alerts(url: str) -> object:
    """Prometheus' /api/v1/alerts answer, parsed."""
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as answer:
        return json.load(answer)


@dataclass
class AlertWatcher:
    """The alerts firing at the last poll, and what changed since."""

    fetch: Callable[[], object]
    firing: frozenset[Alert] = field(default_factory=frozenset)

    def poll(self) -> list[str]:
        """The lines of the alerts that started firing or resolved since the last poll; none when
        Prometheus does not answer (starting, restarting): what was firing is kept until it does."""
        try:
            now = firing_alerts(self.fetch())
        except (OSError, ValueError, http.client.HTTPException):
            return []
        lines = transitions(self.firing, now)
        self.firing = now
        return lines


def watch(url: str, *, interval: float, emit: Callable[[str], None], stop: threading.Event) -> None:
    """Poll Prometheus at `url` every `interval` seconds and `emit` each line of what changed, until
    `stop` is set."""
    watcher = AlertWatcher(partial(fetch_alerts, url))
    while True:
        for line in watcher.poll():
            emit(line)
        if stop.wait(interval):
            return


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m app.devprometheus", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    watcher = commands.add_parser("watch", help="print the alerts that start firing and resolve")
    watcher.add_argument("--url", required=True, help="Prometheus' base URL")
    watcher.add_argument("--interval", type=float, default=POLL_SECONDS, help="seconds between polls")
    args = parser.parse_args()
    # Django's text format: app/devconsole.py reads the line's header and shows it on the console.
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    with contextlib.suppress(KeyboardInterrupt):
        watch(args.url, interval=args.interval, emit=log.info, stop=threading.Event())


if __name__ == "__main__":
    main()
