"""`manage.py create_api_token USER`: a script's personal token without a browser, printed once and
never logged."""

import logging
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


def test_the_printed_token_reads_the_api_as_that_user(caplog: pytest.LogCaptureFixture) -> None:
    fleet_viewer("scripter")
    out = StringIO()
    with caplog.at_level(logging.DEBUG):
        call_command("create_api_token", "scripter", "--name", "nightly-report", stdout=out)
    secret = out.getvalue().strip()
    assert secret.startswith("psu_") and "\n" not in secret
    assert secret not in caplog.text
    response = Client().get("/api/v1/servers", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200
    assert User.objects.get(username="scripter").api_tokens.get().name == "nightly-report"


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [(["nobody"], "no user named"), (["gone"], "not active"), (["scripter", "--name", "x" * 101], "--name")],
)
def test_an_unknown_or_inactive_user_is_refused(arguments: list[str], problem: str) -> None:
    fleet_viewer("scripter")
    User.objects.create_user("gone", is_active=False)
    with pytest.raises(CommandError, match=problem):
        call_command("create_api_token", *arguments, stdout=StringIO())
    assert not User.objects.filter(api_tokens__isnull=False).exists()
