"""Production settings pass Django's deployment checklist; bad settings stop the process."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_passes_with_production_settings() -> None:
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DJANGO_DEBUG="false",
        DJANGO_SECRET_KEY="x" * 64 + "-a-long-random-production-secret",
        DJANGO_ALLOWED_HOSTS="prefixscope.example.com",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_without_a_secret_key_refuses_to_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**env, "DJANGO_DEBUG": "false"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in result.stderr


def test_a_mistyped_setting_names_the_variable() -> None:
    result = manage("check", PREFIXSCOPE_REQUEST_RETENTION_DAYS="thirty")
    assert result.returncode != 0
    assert "PREFIXSCOPE_REQUEST_RETENTION_DAYS='thirty' is not an integer" in result.stderr
