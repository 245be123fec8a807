"""One log call prints one line, in a `manage.py` command as configured by LOGGING (settings.py).

Django's own default logging gave its "django" logger a console handler of its own under DEBUG,
and the records went on to the root's handler as well: every line of Django's (a 404, a refused
ingest batch, django-ninja's) was printed twice under `make run` and by every command.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOGGERS = ["django.request", "django", "app.core", "collectors.otlp"]
SETTINGS = {
    "DEBUG, text log": {"DJANGO_DEBUG": "true", "LOG_FORMAT": "text"},
    "production, JSON log": {
        "DJANGO_DEBUG": "false",
        "LOG_FORMAT": "json",
        "DJANGO_SECRET_KEY": "x" * 64 + "-a-long-random-test-secret",
    },
}


@pytest.mark.parametrize("settings", SETTINGS)
def test_one_log_call_prints_one_line(settings: str) -> None:
    calls = "; ".join(f"logging.getLogger({name!r}).warning('once from [%s]', {name!r})" for name in LOGGERS)
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", f"import logging; {calls}"],
        cwd=ROOT,
        env={**os.environ, **SETTINGS[settings]},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    printed = {name: sum(f"once from [{name}]" in line for line in lines) for name in LOGGERS}
    assert printed == dict.fromkeys(LOGGERS, 1), "\n".join(lines)
