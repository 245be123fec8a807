"""No authentication failure puts a token, a password or prompt text in any log record.

Every logger is captured at DEBUG (the root and each logger with a level of its own), through the
Django test client (no gunicorn in between), with DEBUG off and on: django-ninja's HttpBearer logged a
header of another scheme whole at ERROR under DEBUG, a token sent without `Bearer ` with it.
"""

import base64
import json
import logging
import secrets
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from pytest_django import Settings
from pythonjsonlogger.json import JsonFormatter

from app.api.models import IngestToken
from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.traffic.models import RequestRecord
from tests.support.ports import unused_ports
from tests.support.processes import Web, database_url_for_tests

pytestmark = pytest.mark.django_db

PROMPT = "Summarise the quarterly numbers for ACME-secret-project-" + secrets.token_hex(8)
SALT = "salt-" + secrets.token_hex(8)
ENDPOINTS = {"rest": "/api/v1/requests", "otlp": "/v1/traces"}


def bodies() -> dict[str, tuple[str, str]]:
    """A body with prompt text and a salt for each endpoint, and its content type."""
    record = {
        "server": "vllm-cpu",
        "request_id": "r-1",
        "arrived_at": 0,
        "prompt": PROMPT,
        "cache_salt": SALT,
    }
    attributes = [{"key": "gen_ai.prompt", "value": {"stringValue": PROMPT}}]
    export = {
        "resourceSpans": [{"scopeSpans": [{"spans": [{"name": "llm_request", "attributes": attributes}]}]}]
    }
    return {
        "rest": (json.dumps([record]), "application/json"),
        "otlp": (json.dumps(export), "application/json"),
    }


@pytest.fixture
def tokens() -> dict[str, str]:
    """The secrets of a live and a revoked token, one nobody issued, and one with odd characters."""
    Server.objects.create(name="vllm-cpu", base_url="http://127.0.0.1:18000", block_size=32)
    revoked = create_ingest_token(name="revoked")
    IngestToken.objects.filter(name="revoked").update(revoked=True)
    return {
        "live": create_ingest_token(name="vllm-cpu"),
        "revoked": revoked,
        "unknown": IngestToken.new_secret(),
        "odd": IngestToken.new_secret() + " \t%s{0}ö\x7f'\"\\",
    }


def basic(secret: str) -> str:
    return "Basic " + base64.b64encode(f"{secret}:".encode()).decode()


# The Authorization header of each failure, from the secrets of `tokens`.
HEADERS: dict[str, Callable[[dict[str, str]], str | None]] = {
    "no header": lambda t: None,
    "a live token without Bearer": lambda t: t["live"],
    "a live token in another scheme": lambda t: f"Token {t['live']}",
    "a live token as Basic credentials": lambda t: basic(t["live"]),
    "Bearer and no token": lambda t: "Bearer",
    "an unknown token": lambda t: f"Bearer {t['unknown']}",
    "a revoked token": lambda t: f"Bearer {t['revoked']}",
    "a token with odd characters": lambda t: f"Bearer {t['odd']}",
}


@pytest.fixture
def every_log_record(caplog: pytest.LogCaptureFixture) -> Callable[[], str]:
    """Captures every logger at DEBUG; returns a function giving all that was logged, formatted as
    the text log and as the JSON log (with each record's extra fields, the request of Django's)."""
    caplog.set_level(logging.DEBUG)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            caplog.set_level(logging.DEBUG, logger=name)
    as_json = JsonFormatter()
    return lambda: caplog.text + "\n".join(as_json.format(record) for record in caplog.records)


def secrets_in(logged: str, *values: str) -> list[str]:
    """The values found in the log, whole or as their distinctive part (an escaped or cut form)."""
    return [value for value in values if value in logged or value[4:28] in logged]


@pytest.mark.parametrize("debug", [False, True], ids=["DEBUG off", "DEBUG on"])
@pytest.mark.parametrize("header", HEADERS)
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_refused_ingest_logs_no_token_and_no_prompt(
    client: Client,
    settings: Settings,
    tokens: dict[str, str],
    every_log_record: Callable[[], str],
    endpoint: str,
    header: str,
    debug: bool,
) -> None:
    settings.DEBUG = debug
    authorization = HEADERS[header](tokens)
    body, content_type = bodies()[endpoint]
    headers = {} if authorization is None else {"Authorization": authorization}

    response = client.post(ENDPOINTS[endpoint], body, content_type=content_type, headers=headers)

    assert response.status_code == 401
    assert not RequestRecord.objects.exists()
    logged = every_log_record()
    assert f"Unauthorized: {ENDPOINTS[endpoint]}" in logged  # the capture sees Django's own records
    as_basic = basic(tokens["live"]).removeprefix("Basic ")
    assert secrets_in(logged, *tokens.values(), as_basic, PROMPT, SALT) == []


@pytest.mark.parametrize("debug", [False, True], ids=["DEBUG off", "DEBUG on"])
@pytest.mark.parametrize("login", ["/admin/login/", "/login/"])
def test_a_login_with_a_wrong_password_logs_no_password(
    client: Client,
    settings: Settings,
    every_log_record: Callable[[], str],
    login: str,
    debug: bool,
) -> None:
    settings.DEBUG = debug
    password, wrong = secrets.token_urlsafe(16), "wrong-" + secrets.token_urlsafe(16)
    User.objects.create_user(username="admin", password=password, is_staff=True)

    response = client.post(login, {"username": "admin", "password": wrong})

    assert response.status_code == 200  # the form again, with its error
    assert "_auth_user_id" not in client.session
    assert secrets_in(every_log_record(), password, wrong) == []


@pytest.mark.django_db(transaction=True)
def test_gunicorns_access_log_prints_no_token_sent_as_basic_credentials(tmp_path: Path) -> None:
    # gunicorn's default access format prints `%(u)s`, the user name it decodes from
    # `Authorization: Basic`: an ingest token sent as `curl -u <token>:` was on every line.
    token = create_ingest_token(name="vllm-cpu")
    (port,) = unused_ports(1)
    web = Web(database_url_for_tests(), tmp_path / "web.log", port)
    try:
        web.start().wait_listening(port)
        basic = base64.b64encode(f"{token}:".encode()).decode()
        for authorization in (f"Basic {basic}", token, f"Bearer {token}x"):
            answer = httpx.post(
                f"http://127.0.0.1:{port}/api/v1/requests",
                content=b"[]",
                headers={"Authorization": authorization, "Content-Type": "application/json"},
                timeout=30,
            )
            assert answer.status_code == 401
    finally:
        web.stop()
    log = (tmp_path / "web.log").read_text()
    assert log.count("POST /api/v1/requests") == 3, log  # the access log did print the requests
    assert token not in log and token[4:20] not in log and basic not in log, log
