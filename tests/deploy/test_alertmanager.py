"""deploy/alertmanager/alertmanager.yml passes amtool's check, and routes each kind of alert (by its
severity, owner_kind and owner labels, issue 23) to the receiver that owns its cause."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_prometheus_rules import alert_rules

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def run_amtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """amtool's answer. A missing amtool fails rather than skips, so that CI cannot pass without
    checking the configuration."""
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail(
            "amtool is not installed: run the README's test command (`make test`), which installs it "
            "(Debian package `prometheus-alertmanager`: apt-get install -y --no-install-recommends "
            "prometheus-alertmanager)"
        )
    command = [amtool, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)


def routed_to(labels: dict[str, str], receivers: str) -> None:
    """Assert that an alert with these labels goes to these receivers (comma-separated) and no other."""
    pairs = [f"{name}={value}" for name, value in labels.items()]
    result = run_amtool(
        "config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receivers}", *pairs
    )
    assert result.returncode == 0, (
        f"{pairs} went to {result.stdout.strip()}, not {receivers}: {result.stderr}"
    )


def test_amtool_accepts_the_configuration() -> None:
    result = run_amtool("check-config", CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr


def test_amtool_refuses_a_route_to_a_receiver_that_is_not_defined(tmp_path: Path) -> None:
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(CONFIG.read_text().replace("- receiver: platform\n", "- receiver: platfrom\n", 1))
    assert broken.read_text() != CONFIG.read_text()

    result = run_amtool("check-config", broken)

    assert result.returncode != 0 and "platfrom" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"owner_kind": "template", "owner": "demo-templates", "template": "chat"}, "demo-templates"),
        ({"owner_kind": "template", "owner": "search-prompts", "template": "rag"}, "template-owners"),
        ({"owner_kind": "template", "owner": "unowned", "template": "rag"}, "template-owners"),
        ({"owner_kind": "platform", "owner": "platform", "server": "vllm-0"}, "platform"),
        ({"owner_kind": "platform", "owner": "gpu-eu", "instance": "vllm-3:8000"}, "platform"),
        ({"owner_kind": "prefixscope", "owner": "prefixscope", "kind": "gateway"}, "prefixscope-operators"),
    ],
)
@pytest.mark.parametrize("severity", ["critical", "warning"])
def test_a_page_goes_to_its_owners_receiver(labels: dict[str, str], receiver: str, severity: str) -> None:
    routed_to({"alertname": "Anything", "severity": severity, **labels}, receiver)


@pytest.mark.parametrize(
    "owner", [("template", "demo-templates"), ("platform", "gpu-eu"), ("prefixscope", "prefixscope")]
)
def test_a_notice_goes_to_notices_alone_whatever_its_owner(owner: tuple[str, str]) -> None:
    owner_kind, name = owner
    routed_to(
        {"alertname": "SaltRotated", "severity": "info", "owner_kind": owner_kind, "owner": name}, "notices"
    )


@pytest.mark.parametrize(
    "labels",
    [
        {"alertname": "SomeoneElsesAlert"},
        {"alertname": "NoOwner", "severity": "critical"},
        {"alertname": "UnknownKind", "severity": "warning", "owner_kind": "billing", "owner": "finance"},
    ],
)
def test_an_alert_without_owner_labels_goes_to_the_default_receiver(labels: dict[str, str]) -> None:
    routed_to(labels, "unrouted")


def test_the_notices_route_never_pages() -> None:
    routes = yaml.safe_load(CONFIG.read_text())["route"]["routes"]
    notices = next(route for route in routes if route["receiver"] == "notices")
    assert notices["continue"] is False
    assert notices["repeat_interval"] == "168h"


def test_the_inhibit_rules_name_alerts_the_rules_define() -> None:
    # An inhibit rule naming a renamed alert silently stops inhibiting: nothing else would notice.
    defined = {rule["alert"] for rule in alert_rules()}
    inhibits = yaml.safe_load(CONFIG.read_text())["inhibit_rules"]
    named = {
        matcher.split("=", 1)[1].strip('"')
        for rule in inhibits
        for matcher in rule["source_matchers"] + rule["target_matchers"]
        if matcher.startswith("alertname=")
    }
    assert named and named <= defined, named - defined
