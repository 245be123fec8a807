"""deploy/prometheus passes promtool's checks, and its unit tests cover every alert both ways."""

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client

from app.core.runbooks import RUNBOOKS

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
CONFIG = PROMETHEUS / "prometheus.yml"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))
TEST_FILES = sorted((PROMETHEUS / "tests").glob("*.yml"))


def run_promtool(*args: str | Path) -> None:
    """Run promtool; fail with its whole output when it reports a problem.

    A missing promtool fails rather than skips, so that CI cannot pass without checking the rules.
    """
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail(
            "promtool is not installed: run the README's test command (`make test`), which installs it "
            "(Debian package `prometheus`: apt-get install -y --no-install-recommends prometheus)"
        )
    command = [promtool, *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in load_yaml(path)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def alert_cases() -> list[dict[str, Any]]:
    return [
        case
        for path in TEST_FILES
        for test in load_yaml(path)["tests"]
        for case in test.get("alert_rule_test", [])
    ]


def test_rules_and_their_tests_exist() -> None:
    assert RULE_FILES, "no rule files in deploy/prometheus/rules"
    assert TEST_FILES, "no promtool tests in deploy/prometheus/tests"


def test_rule_files_pass_promtool_check() -> None:
    run_promtool("check", "rules", *RULE_FILES)


def test_rules_pass_their_promtool_unit_tests() -> None:
    run_promtool("test", "rules", *TEST_FILES)


def test_prometheus_config_passes_promtool_check() -> None:
    run_promtool("check", "config", CONFIG)


def test_every_rule_file_is_unit_tested() -> None:
    tested = {
        (path.parent / rule_file).resolve()
        for path in TEST_FILES
        for rule_file in load_yaml(path)["rule_files"]
    }
    assert {path.resolve() for path in RULE_FILES} <= tested


# The labels that say where an alert is: a vLLM instance, or one of Prefixscope's scopes and processes.
WHERE = re.compile(r"\$labels\.(instance|server|template|tenant|name)\b")


@pytest.mark.parametrize("alert", alert_rules(), ids=lambda rule: rule["alert"])
def test_every_alert_says_where_how_bad_and_what_to_do(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in {"warning", "critical", "info"}  # info: a notice, never a page
    annotations = alert["annotations"]
    assert {"summary", "description", "runbook_url"} <= annotations.keys()
    assert WHERE.search(annotations["summary"]), "the summary does not say where"
    assert WHERE.search(annotations["description"]), "the description does not say where"
    if "vllm" in alert["expr"]:  # on vLLM's own metrics or scrapes: the instance and its model
        assert "$labels.instance" in annotations["summary"]
        assert "model" in annotations["description"]
    assert annotations["runbook_url"].startswith("/docs/runbooks/")


@pytest.mark.parametrize("alert", alert_rules(), ids=lambda rule: rule["alert"])
def test_every_alerts_runbook_is_a_page_of_prefixscope(alert: dict[str, Any], client: Client) -> None:
    response = client.get(alert["annotations"]["runbook_url"])
    assert response.status_code == 200
    html = response.content.decode()
    assert f"<h1>{alert['alert']}</h1>" in html
    assert {"What it means", "How to check it in Prefixscope", "What to do"} <= set(
        re.findall(r"<h2>(.*?)</h2>", html)
    )


# Where an alert's owner_kind comes from when it carries no label of its own: the owner-info series it
# joins (the server's group, the template's repository), else the regression's own labels.
JOINED_OWNER_KINDS = (
    ("prefixscope_server_owner_info", "platform"),
    ("prefixscope_template_owner_info", "template"),
    ("prefixscope_regression_active", "template"),
)
STANDS_DOWN = 'unless on () (max(up{job="prefixscope"}) == 1)'


def owner_kind(alert: dict[str, Any]) -> str:
    if "owner_kind" in alert["labels"]:
        return str(alert["labels"]["owner_kind"])
    return next(kind for metric, kind in JOINED_OWNER_KINDS if metric in alert["expr"])


def runbook_fact(html: str, fact: str) -> str:
    found = re.search(rf'<dd class="{fact}">(.*?)</dd>', html, re.S)
    assert found, f"the runbook has no {fact} fact"
    return found.group(1)


@pytest.mark.parametrize("alert", alert_rules(), ids=lambda rule: rule["alert"])
def test_every_runbook_says_who_it_pages_and_what_it_needs(alert: dict[str, Any], client: Client) -> None:
    """The facts at the top of a runbook are the rule's: its owner and severity, its `for`, and the
    history or scrapes its expression reads."""
    runbook = RUNBOOKS[alert["annotations"]["runbook_url"].split("/")[-2]]
    assert (runbook.alert, runbook.severity) == (alert["alert"], alert["labels"]["severity"])
    assert runbook.owner.kind == owner_kind(alert)
    if "owner" in alert["labels"]:
        assert runbook.owner.owner == alert["labels"]["owner"]
    html = client.get(alert["annotations"]["runbook_url"]).content.decode()
    pages = runbook_fact(html, "pages")
    assert ("notice" if alert["labels"]["severity"] == "info" else "page") in pages
    assert f"owner_kind: {runbook.owner.kind}" in pages
    needs = runbook_fact(html, "needs")
    assert f"<code>for: {alert.get('for', '0s')}</code>" in needs, "the runbook does not say its `for`"
    assert "page" in needs or "notice" in needs, "the runbook does not say when it pages after a fault"
    if STANDS_DOWN in alert["expr"]:
        assert "stands down while Prometheus scrapes Prefixscope" in needs
    if "baseline_prompt_tokens" in alert["expr"]:
        assert "hour rollups" in needs
    if "offset" in alert["expr"]:
        assert "history" in needs, "the rule compares with the past: the runbook says how much it needs"


def test_every_runbook_belongs_to_an_alert(client: Client) -> None:
    linked = {rule["annotations"]["runbook_url"] for rule in alert_rules()}
    assert {f"/docs/runbooks/{slug}/" for slug in RUNBOOKS} == linked
    index = client.get("/docs/runbooks/").content.decode()
    assert all(f'href="{url}"' in index for url in linked)
    # The index groups them by who they page: each owner_kind's section holds that kind's alerts.
    sections = re.findall(
        r'<section class="runbook-group" data-owner-kind="(\w+)">(.*?)</section>', index, re.S
    )
    listed = {kind: set(re.findall(r'href="(/docs/runbooks/[^"]+)"', html)) for kind, html in sections}
    expected: dict[str, set[str]] = {}
    for rule in alert_rules():
        expected.setdefault(owner_kind(rule), set()).add(rule["annotations"]["runbook_url"])
    assert listed == expected


@pytest.mark.parametrize("alert", [rule["alert"] for rule in alert_rules()])
def test_every_alert_is_tested_firing_and_not_firing(alert: str) -> None:
    cases = [case for case in alert_cases() if case["alertname"] == alert]
    assert any(case.get("exp_alerts") for case in cases), f"no test where {alert} fires"
    assert any(not case.get("exp_alerts") for case in cases), f"no test where {alert} stays quiet"


def docs_alert_table() -> dict[str, list[str]]:
    """docs/alerts.md's table of alerts: each row's cells after the alert's name."""
    table = re.search(
        r"^\| Alert \| What it means \|.*?\n(?=[^|])", (ROOT / "docs" / "alerts.md").read_text(), re.M | re.S
    )
    assert table, "docs/alerts.md has no table of alerts"
    rows = re.findall(r"^\| (\w+) \| (.*) \|$", table.group(0), re.M)
    return {name: [cell.strip() for cell in rest.split(" | ")] for name, rest in rows if name != "Alert"}


def test_the_docs_alert_table_is_the_rules() -> None:
    """One row per alert, whose "Pages" cell is its owner_kind / severity and whose needs end in its `for`."""
    table = docs_alert_table()
    assert set(table) == {rule["alert"] for rule in alert_rules()}
    for rule in alert_rules():
        _, pages, needs = table[rule["alert"]]
        assert pages.startswith(owner_kind(rule)) and pages.endswith(f"/ {rule['labels']['severity']}"), pages
        assert needs.endswith(f"({rule.get('for', '0m')})"), needs


def test_every_alert_is_tested_with_its_owner() -> None:
    """Alertmanager routes on owner_kind and owner (deploy/alertmanager/alertmanager.yml): every
    firing case expects both, whether the rule sets them or joins them from the series."""
    unowned = [
        f"{case['alertname']} at {case['eval_time']}: {alert['exp_labels']}"
        for case in alert_cases()
        for alert in case.get("exp_alerts") or []
        if not {"owner_kind", "owner"} <= alert["exp_labels"].keys()
    ]
    assert unowned == []
