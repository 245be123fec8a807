"""schemathesis against the live Django app, in process through its WSGI handler: every operation of
/api/openapi.json (and the OTLP receiver it documents) with generated inputs, valid and not, as a
logged-in staff user with an ingest token. No answer may be a 5xx, and every answer must be one
the schema documents (status, content type and body)."""

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from django.test import Client
from django.utils import timezone
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.prompts.models import DeployMarker, Template, TemplateVersion

# Bounded, so that the whole schema runs in a few minutes on two busy cores; derandomized, so that
# a failure seen once is seen again.
EXAMPLES_PER_OPERATION = 50
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@schemathesis.serializer("application/x-protobuf")
def _protobuf(ctx: Any, value: Any) -> bytes:
    """A generated protobuf body (the schema calls it a binary string): its bytes as they are."""
    return value if isinstance(value, bytes) else str(value).encode()


@schemathesis.serializer("application/x-ndjson")
def _ndjson(ctx: Any, value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


@pytest.fixture
def in_test_transaction(credentials: dict[str, str]) -> Iterator[None]:
    """Requests through the WSGI handler keep the test's connection: a finished request closes it
    otherwise, and with it the transaction the test's rows live in (as Django's test client does it;
    after `credentials`, whose test client connects the handler again)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def credentials(db: None) -> dict[str, str]:
    """A staff user's session with its CSRF token, an ingest token, and a little of everything to read."""
    server = Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:9", model="m", block_size=16)
    template = Template.objects.create(name="support-bot")
    version = TemplateVersion.objects.create(
        template=template, commit_sha="a" * 40, committed_at=timezone.now() - timedelta(hours=1)
    )
    DeployMarker.objects.create(template_version=version, server=server, deployed_at=timezone.now())
    client = Client()
    client.force_login(User.objects.create_superuser("fuzz"))
    csrf = client.get("/login/").cookies["csrftoken"].value
    session = client.cookies["sessionid"].value
    return {
        "Cookie": f"sessionid={session}; csrftoken={csrf}",
        "X-CSRFToken": csrf,
        "Authorization": f"Bearer {create_ingest_token(name='fuzz')}",
    }


# Read at collection (pytest-django has set Django up by then; the schema needs no database).
# Not `schemathesis.pytest.from_fixture`: its 4.32.5 renames the test's node through an attribute
# pytest 9 no longer has.
schema = schemathesis.openapi.from_wsgi("/api/openapi.json", WSGIHandler())


@schema.parametrize()
@hypothesis.settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)
def test_no_server_error_and_every_answer_as_documented(
    case: Any, credentials: dict[str, str], in_test_transaction: None
) -> None:
    case.call_and_validate(headers=credentials, checks=CHECKS)
