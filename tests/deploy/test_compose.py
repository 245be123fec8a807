"""docker-compose.yml runs every Prefixscope service, and vLLM with the flags Prefixscope reads.

Docker does not run here: these tests read the file as Compose would, without an engine.
"""

import json
import re
from glob import glob
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
SHARED_ENV: dict[str, str] = COMPOSE["x-prefixscope-env"]
APP_SERVICES = ["migrate", "web", "worker", "beat", "collectors"]
VLLM_COMMAND: list[str] = [str(arg) for arg in SERVICES["vllm"]["command"]]


def flag_value(command: list[str], flag: str) -> str | None:
    """The value of `--flag value` or `--flag=value`; "" for a bare flag; None when absent."""
    for i, arg in enumerate(command):
        if arg == flag:
            following = command[i + 1] if i + 1 < len(command) else ""
            return "" if following.startswith("--") else following
        if arg.startswith(flag + "="):
            return arg.removeprefix(flag + "=")
    return None


def mounts(service: str) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (short syntax, relative to the repo)."""
    result = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            result[target] = (ROOT / source).resolve()
    return result


def test_the_file_uses_the_compose_spec_without_a_version_key() -> None:
    assert "version" not in COMPOSE


@pytest.mark.parametrize(
    "service",
    ["postgres", "valkey", *APP_SERVICES, "prometheus", "alertmanager", "grafana", "vllm"],
)
def test_every_service_is_defined(service: str) -> None:
    assert service in SERVICES


@pytest.mark.parametrize(
    ("service", "command"),
    [
        ("migrate", "sh -c python manage.py migrate --noinput && python manage.py maintain_partitions"),
        ("web", "gunicorn app.wsgi:application --bind 0.0.0.0:8000"),
        ("worker", "celery -A app.celery worker --loglevel=INFO"),
        ("beat", "celery -A app.celery beat --loglevel=INFO"),
        ("collectors", "python manage.py collect_kv_events"),
    ],
)
def test_app_services_run_their_command_from_the_prefixscope_image(service: str, command: str) -> None:
    assert " ".join(SERVICES[service]["command"]).startswith(command)
    assert SERVICES[service]["image"] == SERVICES["web"]["image"]
    assert SERVICES[service]["build"] == "."


@pytest.mark.parametrize("service", APP_SERVICES)
def test_app_services_share_the_env_anchor(service: str) -> None:
    assert SHARED_ENV.items() <= SERVICES[service]["environment"].items()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (
            "DATABASE_URL",
            "postgres://prefixscope:${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}@postgres:5432/prefixscope",
        ),
        ("CELERY_BROKER_URL", "redis://valkey:6379/0"),
        ("DJANGO_SECRET_KEY", "${DJANGO_SECRET_KEY:?set DJANGO_SECRET_KEY}"),
        ("DJANGO_DEBUG", "false"),
        ("OTEL_SDK_DISABLED", "${OTEL_SDK_DISABLED:-true}"),
    ],
)
def test_shared_env_points_at_the_compose_services(name: str, value: str) -> None:
    assert SHARED_ENV[name] == value


def test_allowed_hosts_always_admit_the_internal_callers() -> None:
    # Prometheus scrapes web:8000, vLLM posts spans to web:8000, the health check calls 127.0.0.1.
    hosts = SHARED_ENV["DJANGO_ALLOWED_HOSTS"].split(",")
    assert {"web", "127.0.0.1"} <= set(hosts)


def test_migrate_runs_once() -> None:
    assert SERVICES["migrate"]["restart"] == "no"


@pytest.mark.parametrize(
    ("service", "probe"),
    [
        ("postgres", "pg_isready"),
        ("valkey", "ping"),
        ("web", "/healthz"),
        ("prometheus", "/-/ready"),
        ("alertmanager", "/-/ready"),
        ("grafana", "/api/health"),
    ],
)
def test_health_checks_probe_the_service(service: str, probe: str) -> None:
    assert probe in " ".join(SERVICES[service]["healthcheck"]["test"])


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_dependency_exists_and_its_condition_can_be_met(service: str) -> None:
    for target, spec in SERVICES[service].get("depends_on", {}).items():
        assert target in SERVICES, f"{service} depends on unknown service {target}"
        condition = spec["condition"]
        if condition == "service_healthy":
            assert "healthcheck" in SERVICES[target], f"{target} has no health check"
        elif condition == "service_completed_successfully":
            assert SERVICES[target].get("restart") == "no", f"{target} is not a one-shot service"
        else:
            assert condition == "service_started"


def test_app_services_start_after_migrations() -> None:
    for service in ["web", "worker", "beat", "collectors"]:
        condition = SERVICES[service]["depends_on"]["migrate"]["condition"]
        assert condition == "service_completed_successfully"


def test_vllm_runs_only_with_the_gpu_profile_and_reserves_gpus() -> None:
    vllm = SERVICES["vllm"]
    assert vllm["profiles"] == ["gpu"]
    assert vllm["image"].startswith("vllm/vllm-openai")
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in device["capabilities"] for device in devices)


def test_vllm_serves_a_model_chosen_by_an_env_var_with_a_default() -> None:
    assert VLLM_COMMAND[0].startswith("${VLLM_MODEL:-")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--enable-prefix-caching", ""),
        ("--enable-prompt-tokens-details", ""),
        ("--prefix-caching-hash-algo", "sha256_cbor"),
        ("--otlp-traces-endpoint", "http://web:8000/v1/traces"),
        ("--kv-cache-metrics", ""),
        ("--kv-cache-metrics-sample", "0.01"),
        ("--enable-request-id-headers", ""),
    ],
)
def test_vllm_command_carries_each_flag_prefixscope_needs(flag: str, value: str) -> None:
    assert flag_value(VLLM_COMMAND, flag) == value


def test_vllm_publishes_kv_events_with_replay() -> None:
    raw = flag_value(VLLM_COMMAND, "--kv-events-config")
    assert raw, "--kv-events-config is missing"
    config = json.loads(raw)
    assert config["enable_kv_cache_events"] is True
    assert config["publisher"] == "zmq"
    assert config["endpoint"] == "tcp://*:5557"
    assert config["replay_endpoint"] == "tcp://*:5558"
    assert config["topic"]


def test_vllm_exports_spans_over_otlp_http_to_the_web_service() -> None:
    assert SERVICES["vllm"]["environment"]["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert "web" in SERVICES
    assert any(port.endswith(":8000") for port in SERVICES["web"]["ports"])


def test_prometheus_mounts_its_config_and_the_rules_folder_of_the_repo() -> None:
    mounted = mounts("prometheus")
    assert mounted["/etc/prometheus/prometheus.yml"] == ROOT / "deploy" / "prometheus" / "prometheus.yml"
    rules = mounted["/etc/prometheus/rules"]
    assert rules == ROOT / "deploy" / "prometheus" / "rules"
    assert rules.is_dir() and list(rules.glob("*.yml"))
    assert any(port.endswith(":9090") for port in SERVICES["prometheus"]["ports"])


def test_every_rule_file_prometheus_loads_exists_and_every_rule_file_is_loaded() -> None:
    mounted = mounts("prometheus")
    config = yaml.safe_load(mounted["/etc/prometheus/prometheus.yml"].read_text())
    loaded: set[Path] = set()
    for pattern in config["rule_files"]:
        path = PurePosixPath(pattern)
        mount = next(m for m in mounted if path.is_relative_to(m))
        host_pattern = mounted[mount] / path.relative_to(mount)
        matches = {Path(match) for match in glob(str(host_pattern))}
        assert matches, f"{pattern} ({host_pattern} in the repo) matches no file"
        loaded |= matches
    assert set((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml")) <= loaded


@pytest.mark.parametrize(("job", "service"), [("prefixscope", "web"), ("vllm", "vllm")])
def test_prometheus_scrapes_the_compose_services(job: str, service: str) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    scrape = next(s for s in config["scrape_configs"] if s["job_name"] == job)
    targets = [target for group in scrape["static_configs"] for target in group["targets"]]
    assert f"{service}:8000" in targets


def test_prometheus_sends_its_alerts_to_the_alertmanager_service_which_routes_them_by_owner() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = [
        target
        for alertmanager in config["alerting"]["alertmanagers"]
        for group in alertmanager["static_configs"]
        for target in group["targets"]
    ]
    assert targets == ["alertmanager:9093"]
    alertmanager = SERVICES["alertmanager"]
    assert re.fullmatch(r"prom/alertmanager:v\d+\.\d+\.\d+", alertmanager["image"])  # pinned, no Debian
    assert mounts("alertmanager") == {
        "/etc/alertmanager/alertmanager.yml": ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
    }
    assert flag_value(alertmanager["command"], "--config.file") == "/etc/alertmanager/alertmanager.yml"
    assert any(port.endswith(":9093") for port in alertmanager["ports"])
    assert "alertmanager" in SERVICES["prometheus"]["depends_on"]


def test_grafana_is_provisioned_from_the_repo_beside_prometheus() -> None:
    mounted = mounts("grafana")
    provisioning = mounted["/etc/grafana/provisioning"]
    assert provisioning == ROOT / "deploy" / "grafana" / "provisioning"
    assert list((provisioning / "datasources").glob("*.yml"))
    provider = yaml.safe_load(next((provisioning / "dashboards").glob("*.yml")).read_text())
    dashboards = mounted[provider["providers"][0]["options"]["path"]]
    assert dashboards == ROOT / "deploy" / "grafana" / "dashboards"
    assert list(dashboards.glob("*.json"))
    assert SERVICES["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert any(port.endswith(":3000") for port in SERVICES["grafana"]["ports"])
