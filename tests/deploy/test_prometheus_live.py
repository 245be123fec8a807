"""deploy/prometheus/rules against a real Prometheus scraping a running stack: every group loads,
every rule evaluates without error, every target is up, and every metric a rule reads is scraped.

promtool's unit tests (test_prometheus_rules.py) feed the rules series their authors wrote; this
test feeds them what Prefixscope's /metrics and a vLLM look-alike's /metrics really serve, so a rule
naming a metric (or a label value) that no target exports fails here. The rule files are read when
the test runs: new and changed rules are checked as they are.
"""

import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from django.utils import timezone
from pytest_django.live_server_helper import LiveServer

from tests.support import prometheus_server as prom
from tests.support.live_stack import serve_captured_traffic, store_every_family
from tests.support.promql_names import load_rules, scraped_selectors
from tests.support.simulated_fleet import local_config, running_fleet

pytestmark = pytest.mark.django_db(transaction=True)

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules"
ZERO_TIME = "0001-01-01T00:00:00Z"  # a group's lastEvaluation before its first evaluation


def rule_files() -> list[Path]:
    files = sorted(RULES.glob("*.yml"))
    assert files, f"no rule files in {RULES}"
    return files


@dataclass(frozen=True, slots=True)
class Findings:
    """What Prometheus found wrong, each as a line that says where; all empty when all is well."""

    groups_not_loaded: list[str]
    rules_not_ok: list[str]
    targets_down: list[str]
    names_missing: list[str]
    selectors_unmatched: list[str]


@pytest.fixture
def stack(live_server: LiveServer, tmp_path: Path, settings: Any) -> Iterator[list[prom.Job]]:
    """Prefixscope's /metrics (behind a bearer token, as deploy/prometheus/scrape-with-token.yml
    scrapes it) over rows of every family, and a simulated vLLM server that has served traffic."""
    token = secrets.token_urlsafe(24)
    settings.PREFIXSCOPE_METRICS_BEARER_TOKEN = token
    token_file = tmp_path / "prefixscope-metrics-token"
    token_file.write_text(token + "\n")
    with running_fleet([local_config()]) as (vllm,):
        serve_captured_traffic(vllm)
        store_every_family(vllm, timezone.now())
        yield [
            prom.Job("prefixscope", (urlsplit(live_server.url).netloc,), token_file),
            prom.Job("vllm", (f"{vllm.host}:{vllm.http_port}",)),
        ]


def test_every_rule_evaluates_over_metrics_the_stack_exports(stack: list[prom.Job], tmp_path: Path) -> None:
    files = rule_files()
    with prom.running_prometheus(tmp_path, stack, files) as url:
        findings = check_rules_live(url, files)
    assert asdict(findings) == asdict(Findings([], [], [], [], []))


def test_a_rule_over_a_metric_no_target_exports_is_found(stack: list[prom.Job], tmp_path: Path) -> None:
    copy = tmp_path / "rules"
    shutil.copytree(RULES, copy)
    bogus = {
        "groups": [{"name": "bogus", "rules": [{"alert": "Bogus", "expr": "prefixscope_no_such_metric > 0"}]}]
    }
    (copy / "bogus.yml").write_text(yaml.safe_dump(bogus))
    files = sorted(copy.glob("*.yml"))
    with prom.running_prometheus(tmp_path, stack, files) as url:
        findings = check_rules_live(url, files)
    expected = Findings([], [], [], ["prefixscope_no_such_metric"], ["prefixscope_no_such_metric{}"])
    assert asdict(findings) == asdict(expected)


def check_rules_live(url: str, files: list[Path]) -> Findings:
    """Wait until every target has been scraped and every group evaluated twice since, then read
    what Prometheus says of the targets, the rules and the metrics the rules read."""
    targets_up = prom.wait_until(lambda: _all_up(prom.targets(url)))
    if targets_up:
        _wait_evaluated_twice(url, files)
    rules = load_rules(files)
    names = prom.metric_names(url)
    selectors = scraped_selectors(rules)
    return Findings(
        groups_not_loaded=_groups_not_loaded(url, files),
        rules_not_ok=_rules_not_ok(prom.rule_groups(url)),
        targets_down=[
            f"{t['labels']['job']} {t['scrapeUrl']}: {t['health']} {t['lastError']}"
            for t in prom.targets(url)
            if t["health"] != "up"
        ],
        names_missing=sorted({s.name for s in selectors if s.name is not None and s.name not in names}),
        selectors_unmatched=[s.promql for s in selectors if not prom.has_series(url, s.promql)],
    )


def _all_up(targets: list[dict[str, Any]]) -> bool:
    jobs = {target["labels"]["job"] for target in targets}
    return jobs >= {"prefixscope", "vllm"} and all(target["health"] == "up" for target in targets)


def _wait_evaluated_twice(url: str, files: list[Path]) -> None:
    """Wait until every loaded group of `files` has been evaluated twice after this call (groups
    not loaded are left to the findings)."""
    wanted = {str(path) for path in files}

    def times() -> dict[tuple[str, str], str]:
        return {key: at for key, at in prom.evaluations(url).items() if key[0] in wanted}

    seen = times()
    for count in ("once", "twice"):
        seen = prom.wait_for(partial(_evaluated_since, times, seen), f"every group evaluated {count} more")


def _evaluated_since(
    times: Callable[[], dict[tuple[str, str], str]], before: dict[tuple[str, str], str]
) -> dict[tuple[str, str], str] | None:
    """The groups' evaluation times, once each differs from `before`; else None."""
    now = times()
    return now if all(now.get(key) != at for key, at in before.items()) else None


def _groups_not_loaded(url: str, files: list[Path]) -> list[str]:
    loaded = {(group["file"], group["name"]): len(group["rules"]) for group in prom.rule_groups(url)}
    missing = []
    for path in files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            if loaded.get((str(path), group["name"])) != len(group["rules"]):
                missing.append(f"{path.name} {group['name']}")
    return missing


def _rules_not_ok(groups: list[dict[str, Any]]) -> list[str]:
    return [
        f"{Path(group['file']).name} {group['name']} {rule['name']}: {rule['health']} {rule.get('lastError')}"
        for group in groups
        for rule in group["rules"]
        if rule["health"] != "ok" or rule.get("lastError") or rule["lastEvaluation"] == ZERO_TIME
    ]
