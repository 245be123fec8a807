"""deploy/grafana: the provisioned data source is the compose Prometheus, and every query of the
dashboard parses (promtool) and names only series that Prefixscope's /metrics, vLLM's /metrics (the
real capture) or the recording rules of deploy/prometheus really produce."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from django.utils import timezone

from app.prompts.models import Template
from app.traffic.models import LossHour
from tests.deploy.test_prometheus_rules import RULE_FILES, load_yaml, run_promtool
from tests.support.captures import VLLM_CPU_FIXTURES
from tests.support.factories import a_server

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
VLLM_CAPTURE = VLLM_CPU_FIXTURES / "metrics-after.txt"
KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan"}
# Grafana's own variables, replaced by a value of their kind before promtool parses a query.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target of every dashboard."""
    return [
        (f"{path.name} #{panel['id']} {panel['title']} {target['refId']}", target["expr"])
        for path in DASHBOARDS
        for panel in panels(json.loads(path.read_text()))
        for target in panel["targets"]
    ]


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads: identifiers that are not functions, keywords,
    label names (in braces and grouping clauses), strings, durations or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = re.findall(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text)
    return {name for name in names if name not in KEYWORDS}


def exported_names(exposition: str) -> set[str]:
    """Every sample name an exposition has or may have: those sampled, and those its TYPE lines
    promise (a counter's _total, a histogram's _bucket, _sum and _count)."""
    names = {line.split("{")[0].split()[0] for line in exposition.splitlines() if line and line[0] != "#"}
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M):
        names |= {name.removesuffix("_total") + suffix for suffix in suffixes.get(kind, [""])}
    return names


def recorded_names() -> set[str]:
    return {
        rule["record"]
        for path in RULE_FILES
        for group in load_yaml(path)["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def test_the_data_source_is_the_compose_prometheus_and_every_panel_uses_it() -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = provisioned["datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")
    assert DASHBOARDS
    for path in DASHBOARDS:
        for panel in panels(json.loads(path.read_text())):
            assert panel["targets"], f"{panel['title']} has no query"
            assert {panel["datasource"]["uid"]} | {t["datasource"]["uid"] for t in panel["targets"]} == {
                source["uid"]
            }


def test_the_dashboard_covers_fleet_template_server_and_collector_health() -> None:
    for path in DASHBOARDS:
        rows = [p["title"] for p in json.loads(path.read_text())["panels"] if p["type"] == "row"]
        assert rows == ["Fleet", "Template", "Server", "Collector health"]


def test_every_query_parses(tmp_path: Path) -> None:
    rules = []
    for i, (_, expr) in enumerate(queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"grafana:query_{i}", "expr": expr})
    rule_file = tmp_path / "grafana-queries.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}))
    run_promtool("check", "rules", rule_file)


@pytest.mark.django_db
def test_every_series_a_query_names_is_exported(client: Client) -> None:
    # A real scrape of Prefixscope, with a server and a template's traffic in its rollups.
    server = a_server(name="vllm-0", model="llama")
    LossHour.objects.create(
        server=server,
        template=Template.objects.create(name="support"),
        tenant="acme",
        hour=timezone.now().replace(minute=0, second=0, microsecond=0),
        requests=1,
        diagnosed=1,
        diagnosed_prompt_tokens=100,
        reused_tokens=50,
    )
    known = exported_names(client.get("/metrics").content.decode())
    known |= exported_names(VLLM_CAPTURE.read_text()) | recorded_names()

    unknown = {where: metric_names(expr) - known for where, expr in queries()}
    assert {where: names for where, names in unknown.items() if names} == {}


def test_the_template_variables_list_exported_series() -> None:
    for path in DASHBOARDS:
        for variable in json.loads(path.read_text())["templating"]["list"]:
            metric = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
            assert metric, variable["definition"]
            assert metric.group(2) == variable["name"]
            assert metric.group(1).startswith("prefixscope_")


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (cause) (rate(prefixscope_template_lost_tokens_total{template=~"$t"}[5m]))',
         {"prefixscope_template_lost_tokens_total"}),
        ("a:b:rate5m < on (model) group_left () (0.5 * c_total offset 1h) and bool d",
         {"a:b:rate5m", "c_total", "d"}),
        ("histogram_quantile(0.9, sum by (le) (rate(x_bucket[$__rate_interval])))", {"x_bucket"}),
    ],
)  # fmt: skip
def test_metric_names_are_told_from_functions_labels_and_keywords(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
