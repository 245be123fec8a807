"""docker-compose.yml passes Compose's own validation (`docker-compose config`), which needs no Docker daemon.

Debian's docker-compose (1.29, installed by the test command) checks the file against its schema,
resolves the variables, anchors and relative paths, and prints the file as Compose would run it.
"""

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {"POSTGRES_PASSWORD": "x", "DJANGO_SECRET_KEY": "y", "GRAFANA_ADMIN_PASSWORD": "z"}


def compose_config(compose_file: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`docker-compose -f FILE config ARGS` with only `env` (and PATH, HOME) in its environment."""
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail(
            "docker-compose is not installed: run the README's test command (`make test`), which installs "
            "it (Debian package `docker-compose`)"
        )
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **env}
    command = [binary, "-f", str(compose_file), "config", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=clean)


def resolved() -> dict[str, Any]:
    result = compose_config(ROOT / "docker-compose.yml", REQUIRED)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_the_repository_compose_file_validates() -> None:
    result = compose_config(ROOT / "docker-compose.yml", REQUIRED, "-q")
    assert result.returncode == 0, result.stderr


def test_a_file_with_a_misspelt_key_is_refused(tmp_path: Path) -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "    healthcheck:\n" in text
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace("    healthcheck:\n", "    healthchek:\n", 1))
    result = compose_config(broken, REQUIRED, "-q")
    assert result.returncode != 0
    assert "healthchek" in result.stderr


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_each_required_variable_must_be_set(missing: str) -> None:
    env = {name: value for name, value in REQUIRED.items() if name != missing}
    result = compose_config(ROOT / "docker-compose.yml", env, "-q")
    assert result.returncode != 0
    assert f"set {missing}" in result.stderr


def bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path of the bind mounts, as Compose resolved them (absolute)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("/"):
            found[target] = source
    return found


def test_prometheus_alertmanager_and_grafana_are_provisioned_from_the_repository_deploy_folder() -> None:
    services = resolved()["services"]
    deploy = ROOT / "deploy"
    assert bind_mounts(services["prometheus"]) == {
        "/etc/prometheus/prometheus.yml": str(deploy / "prometheus" / "prometheus.yml"),
        "/etc/prometheus/rules": str(deploy / "prometheus" / "rules"),
    }
    assert bind_mounts(services["alertmanager"]) == {
        "/etc/alertmanager/alertmanager.yml": str(deploy / "alertmanager" / "alertmanager.yml"),
    }
    assert bind_mounts(services["grafana"]) == {
        "/etc/grafana/provisioning": str(deploy / "grafana" / "provisioning"),
        "/var/lib/grafana/dashboards": str(deploy / "grafana" / "dashboards"),
    }
    assert (
        services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == REQUIRED["GRAFANA_ADMIN_PASSWORD"]
    )
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
