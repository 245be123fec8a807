"""A real Prometheus (Debian's package `prometheus`) run for one test, and what its HTTP API says.

Scrapes and rule evaluations every second, storage in a temporary folder, the HTTP API on a free
loopback port; the process is ended when the block ends, whatever happened in it.
"""

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.support.ports import unused_port

# The CI machine has two busy cores: Prometheus may take a while to start, scrape and evaluate.
DEADLINE_SECONDS = 60.0
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Job:
    """One scrape job: its name, its targets (host:port) and, when /metrics wants one, a bearer
    token file (as deploy/prometheus/scrape-with-token.yml sends it)."""

    name: str
    targets: tuple[str, ...]
    token_file: Path | None = None


def config(jobs: list[Job], rule_files: list[Path]) -> dict[str, Any]:
    """A Prometheus configuration scraping `jobs` and evaluating `rule_files` every second."""
    scrape_configs: list[dict[str, Any]] = []
    for job in jobs:
        scrape: dict[str, Any] = {
            "job_name": job.name,
            "metrics_path": "/metrics",
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "static_configs": [{"targets": list(job.targets)}],
        }
        if job.token_file is not None:
            scrape["authorization"] = {"type": "Bearer", "credentials_file": str(job.token_file)}
        scrape_configs.append(scrape)
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": scrape_configs,
    }


def prometheus_binary() -> str:
    """Prometheus' path; a missing one fails (CI must not pass without the check)."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail(
            "prometheus is not installed: run the README's test command (`make test`), which installs it "
            "(Debian package `prometheus`: apt-get install -y --no-install-recommends prometheus)"
        )
    return found


@contextmanager
def running_prometheus(folder: Path, jobs: list[Job], rule_files: list[Path]) -> Iterator[str]:
    """Run Prometheus over `jobs` and `rule_files` until the block ends; yields its base URL once
    its API answers. Its output goes to `folder`/prometheus.log, shown when it does not start."""
    config_file = folder / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config(jobs, rule_files)))
    port = unused_port()
    log = folder / "prometheus.log"
    command = [
        prometheus_binary(),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url, process, log), "Prometheus to answer")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _ready(url: str, process: subprocess.Popen[bytes], log: Path) -> bool | None:
    """True once Prometheus answers ready; None before."""
    if process.poll() is not None:
        pytest.fail(f"Prometheus exited {process.returncode}:\n{log.read_text()}")
    try:
        return httpx.get(f"{url}/-/ready", timeout=5).status_code == 200 or None
    except httpx.TransportError:
        return None


def wait_for(check: Callable[[], T | None], what: str, timeout: float = DEADLINE_SECONDS) -> T:
    """Poll `check` until it returns something other than None, and return it; fail after `timeout`
    seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.2)


def api(url: str, path: str, **params: str | list[str]) -> Any:
    """The `data` of one answer of Prometheus' HTTP API."""
    answer = httpx.get(f"{url}/api/v1/{path}", params=params, timeout=10)
    answer.raise_for_status()
    body = answer.json()
    assert body["status"] == "success", body
    return body["data"]


def rule_groups(url: str) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = api(url, "rules")["groups"]
    return groups


def evaluations(url: str) -> dict[tuple[str, str], str]:
    """The last evaluation time of each rule group, by (file, group name); the zero time when the
    group has not been evaluated yet."""
    return {(group["file"], group["name"]): group["lastEvaluation"] for group in rule_groups(url)}


def targets(url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api(url, "targets")["activeTargets"]
    return found


def metric_names(url: str) -> set[str]:
    """Every metric name Prometheus holds a series of."""
    return set(api(url, "label/__name__/values"))


def has_series(url: str, selector: str) -> bool:
    """Whether Prometheus holds a series that `selector` matches."""
    return bool(api(url, "series", **{"match[]": selector}))


def wait_until(check: Callable[[], bool], timeout: float = DEADLINE_SECONDS) -> bool:
    """Poll `check` until it is true or `timeout` seconds have passed; whether it became true (the
    caller then reports what is wrong in detail)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
