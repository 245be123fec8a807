"""`make run`'s Prometheus: the configuration it is given, and the watcher's console lines of alerts
firing and resolving, down to a real Prometheus evaluating a rule over a tiny /metrics."""

import copy
import http.server
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from app import devprometheus
from app.devprometheus import Alert, AlertWatcher, alert_line, firing_alerts, prometheus_config, transitions
from tests.support import prometheus_server as prom
from tests.support.ports import unused_port

ROOT = Path(__file__).resolve().parents[2]

# As Prometheus 2.42 (Debian's 2.42.0+ds) answers GET /api/v1/alerts: a firing alert and a pending
# one (captured from the real server, a rule with `for: 1h` for the pending one).
ANSWER: dict[str, Any] = {
    "status": "success",
    "data": {
        "alerts": [
            {
                "labels": {
                    "alertname": "RegressionOpen",
                    "instance": "127.0.0.1:8000",
                    "job": "prefixscope",
                    "kind": "prompt",
                    "name": "support",
                    "owner": "demo-templates",
                    "owner_kind": "template",
                    "scope": "template",
                    "severity": "warning",
                    "template": "support",
                },
                "annotations": {"summary": "Open hit_rate regression of template support (prompt)"},
                "state": "firing",
                "activeAt": "2026-12-06T01:07:00.327865253Z",
                "value": "1e+00",
            },
            {
                "labels": {
                    "alertname": "SaltRotated",
                    "owner": "platform",
                    "owner_kind": "platform",
                    "severity": "info",
                    "tenant": "acme",
                },
                "annotations": {},
                "state": "pending",
                "activeAt": "2026-12-06T01:07:00.327865253Z",
                "value": "4.2e-01",
            },
        ]
    },
}
VLLM_DOWN = {
    "labels": {
        "alertname": "VLLMMetricsDown",
        "instance": "127.0.0.1:8101",
        "job": "vllm",
        "owner": "platform",
        "owner_kind": "platform",
        "severity": "critical",
    },
    "annotations": {},
    "state": "firing",
    "activeAt": "2026-12-06T01:08:00Z",
    "value": "0e+00",
}


def answer(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": {"alerts": list(alerts)}}


def test_the_config_scrapes_the_web_and_the_demo_and_loads_the_shipped_rules(tmp_path: Path) -> None:
    token = tmp_path / "metrics-token"
    config = prometheus_config(
        web="127.0.0.1:8000",
        vllm=["127.0.0.1:8101", "127.0.0.1:8102"],
        rules=devprometheus.rule_files(),
        token_file=token,
    )

    assert config["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    shipped = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
    assert shipped and config["rule_files"] == [str(path) for path in shipped]
    assert all(Path(path).is_absolute() for path in config["rule_files"])
    prefixscope, vllm = config["scrape_configs"]
    assert prefixscope["job_name"] == "prefixscope"
    assert prefixscope["static_configs"] == [{"targets": ["127.0.0.1:8000"]}]
    assert prefixscope["authorization"] == {"type": "Bearer", "credentials_file": str(token)}
    assert vllm["job_name"] == "vllm"
    assert vllm["static_configs"] == [{"targets": ["127.0.0.1:8101", "127.0.0.1:8102"]}]


def test_without_the_demo_or_a_token_only_the_web_is_scraped_without_credentials() -> None:
    config = prometheus_config(web="127.0.0.1:8000", vllm=[], rules=[], token_file=None)

    [prefixscope] = config["scrape_configs"]
    assert "authorization" not in prefixscope


def test_promtool_accepts_the_generated_config_with_the_rules_as_shipped(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: the test command installs Debian's prometheus"
    (tmp_path / "token").write_text("t\n")
    config = prometheus_config(
        web="127.0.0.1:8000",
        vllm=["127.0.0.1:8101"],
        rules=devprometheus.rule_files(),
        token_file=tmp_path / "token",
    )
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))

    checked = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(devprometheus.rule_files())} rule files found" in checked.stdout + checked.stderr


def test_setup_writes_the_config_keeps_the_token_private_and_wipes_the_run_befores_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = unused_port()
    monkeypatch.setenv("PREFIXSCOPE_PROMETHEUS_PORT", str(port))
    (tmp_path / "data" / "wal").mkdir(parents=True)
    with (tmp_path / "log").open("w") as log:
        found = devprometheus.setup(
            folder=tmp_path,
            web_port=8000,
            vllm_ports=[8101],
            env={"PREFIXSCOPE_METRICS_BEARER_TOKEN": " s3cret "},
            log=log,
        )

    assert not (tmp_path / "data").exists()
    token = tmp_path / "metrics-token"
    assert token.read_text() == "s3cret\n" and stat.S_IMODE(token.stat().st_mode) == 0o600
    written = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert written["scrape_configs"][0]["authorization"]["credentials_file"] == str(token)
    assert "s3cret" not in (tmp_path / "prometheus.yml").read_text() + str(found)
    assert f"--web.listen-address=127.0.0.1:{port}" in found.processes["prometheus"]
    assert f"--url http://127.0.0.1:{port}" in found.processes["alerts"]
    assert found.notice.startswith(f"Prometheus: http://127.0.0.1:{port}/alerts")


def test_with_its_port_taken_or_no_prometheus_the_run_goes_on_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken, (tmp_path / "log").open("w") as log:
        taken.bind(("127.0.0.1", 0))
        monkeypatch.setenv("PREFIXSCOPE_PROMETHEUS_PORT", str(taken.getsockname()[1]))
        busy = devprometheus.setup(folder=tmp_path, web_port=8000, vllm_ports=[], env={}, log=log)
        monkeypatch.setenv("PATH", str(tmp_path))  # neither prometheus nor apt-get
        missing = devprometheus.setup(folder=tmp_path, web_port=8000, vllm_ports=[], env={}, log=log)

    assert busy.processes == {} and "is taken" in busy.notice and "running without it" in busy.notice
    assert missing.processes == {} and "not installed" in missing.notice


def test_an_alert_line_names_the_alert_its_owner_where_it_is_and_whether_it_pages() -> None:
    firing = firing_alerts(ANSWER)

    assert [alert_line(alert, "firing") for alert in firing] == [
        "alert firing: RegressionOpen  owner=template/demo-templates  template=support  (page)"
    ]
    notice = Alert(tuple(sorted(ANSWER["data"]["alerts"][1]["labels"].items())))
    assert (
        alert_line(notice, "resolved")
        == "alert resolved: SaltRotated  owner=platform/platform  tenant=acme  (notice)"
    )
    down = firing_alerts(answer(VLLM_DOWN))
    assert [alert_line(alert, "firing") for alert in down] == [
        "alert firing: VLLMMetricsDown  owner=platform/platform  instance=127.0.0.1:8101  (page)"
    ]


def test_pending_alerts_are_not_firing_and_a_bad_answer_is_refused() -> None:
    assert {alert.label("alertname") for alert in firing_alerts(ANSWER)} == {"RegressionOpen"}
    bad_answers: list[object] = [
        {"status": "error", "errorType": "bad_data", "error": "x"},
        {"status": "success"},
        [],
        None,
    ]
    for bad in bad_answers:
        with pytest.raises(ValueError):
            firing_alerts(bad)


def test_transitions_say_what_started_firing_and_what_resolved() -> None:
    regression = firing_alerts(ANSWER)
    both = firing_alerts(answer(ANSWER["data"]["alerts"][0], VLLM_DOWN))

    assert transitions(frozenset(), regression) == [alert_line(next(iter(regression)), "firing")]
    assert transitions(regression, both) == [alert_line(next(iter(both - regression)), "firing")]
    assert transitions(both, both) == []
    assert transitions(both, frozenset()) == [alert_line(alert, "resolved") for alert in sorted(both)]


def test_the_watcher_reports_each_change_once_and_keeps_its_state_while_prometheus_is_away() -> None:
    answers: list[object] = [ANSWER, ANSWER, OSError("refused"), ValueError("half an answer"), answer()]

    def fetch() -> object:
        found = answers.pop(0)
        if isinstance(found, Exception):
            raise found
        return copy.deepcopy(found)

    watcher = AlertWatcher(fetch)

    polls = [watcher.poll() for _ in range(5)]

    firing = "alert firing: RegressionOpen  owner=template/demo-templates  template=support  (page)"
    resolved = firing.replace("alert firing:", "alert resolved:")
    assert polls == [[firing], [], [], [], [resolved]]


class _Metrics(http.server.BaseHTTPRequestHandler):
    value = "1"

    def do_GET(self) -> None:
        body = f'# TYPE demo_fault gauge\ndemo_fault{{template="support"}} {self.value}\n'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving_metrics() -> Iterator[tuple[str, type[_Metrics]]]:
    """A tiny /metrics on a free port (host:port), whose value the test sets."""
    handler = type("Metrics", (_Metrics,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", unused_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


RULE = {
    "groups": [
        {
            "name": "demo",
            "rules": [
                {
                    "alert": "DemoFault",
                    "expr": "demo_fault > 0",
                    "labels": {"severity": "warning", "owner_kind": "template", "owner": "demo-templates"},
                }
            ],
        }
    ]
}


@pytest.mark.timeout(120)
def test_a_real_prometheus_with_the_generated_config_fires_and_resolves_and_the_watcher_says_so(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "demo.rules.yml"
    rules.write_text(yaml.safe_dump(RULE))
    config = tmp_path / "prometheus.yml"
    port = unused_port()
    lines: list[str] = []
    stop = threading.Event()
    with serving_metrics() as (web, metrics):
        config.write_text(yaml.safe_dump(prometheus_config(web=web, vllm=[], rules=[rules], interval="1s")))
        command = [
            prom.prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        with (tmp_path / "prometheus.log").open("wb") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        watcher = threading.Thread(
            target=devprometheus.watch,
            args=(url,),
            kwargs={"interval": 0.2, "emit": lines.append, "stop": stop},
        )
        watcher.start()
        try:
            firing = "alert firing: DemoFault  owner=template/demo-templates  template=support  (page)"
            prom.wait_for(lambda: (firing in lines) or None, f"{firing!r}; seen {lines}")
            metrics.value = "0"
            resolved = firing.replace("firing:", "resolved:")
            prom.wait_for(lambda: (resolved in lines) or None, f"{resolved!r}; seen {lines}")
        finally:
            stop.set()
            watcher.join(timeout=10)
            process.terminate()
            process.wait(timeout=30)
    assert lines == [firing, resolved], (tmp_path / "prometheus.log").read_text()
