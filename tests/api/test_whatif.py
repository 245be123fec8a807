"""The what-if API: a question asked (202), polled until its task answered it, listed; bad windows and
scopes answered 400 in the API's error shape; another tenant's question a 404."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

import app.whatif.tasks  # noqa: F401 - registers the task a question queues (eager here)
from app.api.services import create_ingest_token, create_personal_token
from app.core.models import Membership
from app.whatif.models import WhatIfQuestion
from app.whatif.results import answers_out
from app.whatif.services import Scope, ScopeKind, ask
from tests.support.virtual_fleet import run_virtually
from tests.whatif.test_ask import demo

URL = "/api/v1/whatif"
D1, D2 = "2026-01-01", "2026-01-02"


def _bearer(user: User) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_personal_token(user=user, name='ci')[1]}"}


def _admin() -> dict[str, str]:
    return _bearer(User.objects.create_superuser("admin"))


def _member(username: str, tenant: str) -> dict[str, str]:
    user = User.objects.create_user(username)
    Membership.objects.create(user=user, tenant=tenant)
    return _bearer(user)


def _post(client: Client, body: Any, headers: dict[str, str]) -> Any:
    return client.post(URL, body, content_type="application/json", headers=headers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("eager")
def test_a_question_is_accepted_then_polled_until_answered(client: Client, tmp_path: Path) -> None:
    run = run_virtually(demo(180), tmp_path, scrape_every=15)
    since, until = run.at(0), run.at(181)
    admin = _admin()

    asked = _post(client, {"scope": "fleet", "since": since.isoformat(), "until": until.isoformat()}, admin)

    assert asked.status_code == 202, asked.content
    question = asked.json()
    assert question["scope"] == "fleet" and question["state"] in ("queued", "running", "done")
    assert (
        question["url"].endswith(f"{URL}/{question['id']}") and asked["Location"] == f"{URL}/{question['id']}"
    )
    polled = client.get(question["url"], headers=admin)
    assert polled.status_code == 200
    found = polled.json()
    assert found["state"] == "done" and found["progress"] == 1.0 and found["error"] == ""
    expected = answers_out(ask(scope=Scope(ScopeKind.FLEET), since=since, until=until).answers)
    answers = found["answers"]
    assert answers["calibration"]["trust"] == "good" and answers["trusted"] is True
    calibration, expected_calibration = dict(answers["calibration"]), dict(expected["calibration"])
    assert calibration.pop("uncompared") == list(expected_calibration.pop("uncompared")) == []
    assert calibration == pytest.approx(expected_calibration)
    assert [a["hit_rate"] for a in answers["capacity"]] == pytest.approx(
        [a["hit_rate"] for a in expected["capacity"]]
    )
    assert isinstance(answers["capacity"][0]["saved_tokens_per_hour"], float)
    assert answers["price"] == expected["price"] and answers["price"]["rate_source"] in (
        "measured",
        "configured",
    )
    assert answers["restarts"] == []  # the demo's first three minutes: no cut, no restart
    assert {a["kind"] for a in answers["routing"]} == {"routing"} and len(answers["curve"]) > 8
    listed = client.get(URL, {"scope": "fleet"}, headers=admin).json()
    assert [q["id"] for q in listed["items"]] == [question["id"]] and "answers" not in listed["items"][0]
    assert client.get(URL, {"scope": "template"}, headers=admin).json()["count"] == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"scope": "tenant", "minutes": 10}, "invalid", "scope"),
        ({"scope": "fleet", "minutes": 0}, "invalid", "minutes"),
        ({"scope": "fleet", "since": f"{D1}T10:00:00Z", "until": f"{D1}T10:00:00Z"}, "bad_window", "until"),
        ({"scope": "fleet", "since": f"{D1}T10:00:00Z", "until": f"{D1}T09:00:00Z"}, "bad_window", "until"),
        ({"scope": "fleet", "since": f"{D1}T00:00:00Z", "until": f"{D2}T00:00:01Z"}, "bad_window", "until"),
        ({"scope": "fleet", "since": f"{D1}T00:00:00Z", "minutes": 5}, "bad_window", "minutes"),
        ({"scope": "fleet", "until": "2026-01-01T00:00:00Z"}, "bad_window", "since"),
        ({"scope": "fleet", "name": "all"}, "bad_scope", "name"),
        ({"scope": "template"}, "bad_scope", "name"),
        ({"scope": "template", "name": "nobody"}, "unknown_scope", "name"),
        ({"scope": "group", "name": "nobody"}, "unknown_scope", "name"),
    ],
)  # fmt: skip
def test_a_bad_question_is_a_400_saying_what_is_wrong(
    client: Client, body: dict[str, Any], code: str, field: str
) -> None:
    answer = _post(client, body, _admin())

    assert answer.status_code == 400
    assert answer.json()["code"] == code and field in answer.json()["fields"], answer.json()
    assert not WhatIfQuestion.objects.exists()


@pytest.mark.django_db
def test_a_body_that_is_not_json_is_a_400(client: Client) -> None:
    answer = _post(client, '{"scope": "fleet",', _admin())

    assert answer.status_code == 400
    assert answer.json() == {"code": "bad_body", "message": "the body is not JSON", "fields": {}}


@pytest.mark.django_db
def test_an_ingest_token_asks_nothing(client: Client) -> None:
    token = {"Authorization": f"Bearer {create_ingest_token(name='ci')}"}

    assert _post(client, {"scope": "fleet"}, token).status_code == 401


@pytest.mark.django_db
def test_another_tenants_question_is_a_404_but_an_admins_to_read(client: Client) -> None:
    now = timezone.now()
    question = WhatIfQuestion.objects.create(
        scope="fleet", since=now - timedelta(minutes=10), until=now, tenants=["acme"]
    )
    acme, globex, admin = _member("a", "acme"), _member("g", "globex"), _admin()

    assert client.get(f"{URL}/{question.pk}", headers=acme).json()["id"] == question.pk
    assert client.get(f"{URL}/{question.pk}", headers=admin).status_code == 200
    hidden = client.get(f"{URL}/{question.pk}", headers=globex)
    assert hidden.status_code == 404 and hidden.json()["code"] == "not_found"
    assert client.get(URL, headers=globex).json()["count"] == 0
    assert client.get(URL, headers=acme).json()["count"] == 1
