"""A template's cache killers through the REST API, on the template's page and on a request's page; their
samples (prompt text) only for viewers who may read prompts, and only while the token ids are kept."""

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from app.compare.tasks import find_killers
from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.prompts.models import CacheKiller, Template
from app.traffic.models import RequestDiagnosis, RequestRecord
from tests.support.killer_traffic import ingest, sim, timestamp_token, volatile_top
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db
__all__ = ["sim"]  # the fixture


@pytest.fixture
def support(client: Client, token: str, sim: Server) -> Template:
    """The support template's traffic ingested, and its killers found."""
    ingest(client, token, volatile_top(), server=sim)
    find_killers()
    assert CacheKiller.objects.count() == 1
    return Template.objects.get(name="support")


@pytest.fixture
def reader() -> Client:
    """A logged-in user who may read prompt text."""
    user = fleet_viewer("reader")
    user.user_permissions.add(Permission.objects.get(codename="read_prompt_text"))
    client = Client()
    client.force_login(user)
    return client


def killers(client: Client, template: Template, query: str = "", **headers: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/templates/{template.pk}/killers{query}", headers=headers)
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


def test_the_api_gives_each_killer_its_position_class_suggestion_and_cost(
    engineer: Client, support: Template
) -> None:
    answer = killers(engineer, support)
    assert answer["template"] == "support" and answer["computed_at"]
    (killer,) = answer["killers"]
    assert (killer["kind"], killer["mode"], killer["position_token"]) == (
        "timestamp",
        "tokens",
        timestamp_token(),
    )
    assert killer["suggestion"].startswith("Move the timestamp") and killer["tokens_lost"] > 0
    assert killer["requests_affected"] <= killer["requests"] == len(volatile_top())
    assert killer["sample_requests"] and all(s["server"] == "sim-a" for s in killer["sample_requests"])
    assert killer["samples"] is None
    assert engineer.get("/api/v1/templates/999999/killers").status_code == 404


def test_samples_are_withheld_from_a_viewer_without_rights(
    engineer: Client, reader: Client, support: Template, token: str
) -> None:
    (withheld,) = killers(engineer, support, "?samples=true")["killers"]
    assert withheld["samples"] is None and "may not read prompt text" in withheld["samples_missing"]
    bearer = {"Authorization": f"Bearer {token}"}
    refused = Client().get(f"/api/v1/templates/{support.pk}/killers?samples=true", headers=bearer)
    assert refused.status_code == 401  # an ingest token reads nothing, samples least of all
    assert killers(reader, support)["killers"][0]["samples"] is None  # not asked for

    (shown,) = killers(reader, support, "?samples=true")["killers"]
    assert 2 <= len(shown["samples"]) <= 5 and shown["samples_missing"] is None
    assert all(sample.startswith("Current time: 2026-01-01T") for sample in shown["samples"])

    page = engineer.get(reverse("dashboard:template-detail", args=[support.pk])).content.decode()
    assert "Timestamp or date" in page and f"token {timestamp_token()}" in page
    assert "Move the timestamp" in page and "Current time: 2026" not in page
    assert "Searched every 5 minutes" in page  # PREFIXSCOPE_KILLER_EVERY_SECONDS, 300 by default
    page = reader.get(reverse("dashboard:template-detail", args=[support.pk])).content.decode()
    assert all(sample in page for sample in shown["samples"])


def test_samples_go_when_their_token_ids_do(reader: Client, support: Template) -> None:
    RequestRecord.objects.update(token_ids=None)  # what the expiry of token retention does
    (killer,) = killers(reader, support, "?samples=true")["killers"]
    assert killer["samples"] == [] and "no longer kept" in killer["samples_missing"]
    page = reader.get(reverse("dashboard:template-detail", args=[support.pk])).content.decode()
    assert "Current time: 2026" not in page and "no longer kept" in page


def test_the_request_page_says_whether_the_request_departs_at_a_killer(
    engineer: Client, support: Template
) -> None:
    diagnose_requests(now=timezone.now() + timedelta(minutes=2))
    texts = {f"req-none-{i:04d}": p.text for i, p in enumerate(volatile_top())}
    departed = RequestDiagnosis.objects.filter(diverged_at__isnull=False)
    # The last request departs from its nearest earlier one in the timestamp's digits, in the line that
    # starts at the killer; a request before the fault departs at its question, near its end.
    faulted = departed.order_by("arrived_at").last()
    unfaulted = next(d for d in departed if not texts[d.request_id].startswith("Current time:"))
    assert faulted is not None and texts[faulted.request_id].startswith("Current time:")
    assert faulted.diverged_at is not None and timestamp_token() < faulted.diverged_at < 48
    assert unfaulted.diverged_at is not None and unfaulted.diverged_at > 300

    page = engineer.get(reverse("dashboard:request-detail", args=["sim-a", faulted.request_id])).content
    assert "at a cache killer of its template" in page.decode()
    assert "this request departs here" in page.decode() and "Timestamp or date" in page.decode()
    page = engineer.get(reverse("dashboard:request-detail", args=["sim-a", unfaulted.request_id])).content
    assert "Timestamp or date" in page.decode() and "this request departs here" not in page.decode()
    assert reverse("dashboard:template-detail", args=[support.pk]) in page.decode()


def test_the_openapi_schema_documents_the_killers(client: Client) -> None:
    operation = client.get("/api/openapi.json").json()["paths"]["/api/v1/templates/{template}/killers"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"template", "samples"}
    # and the errors every operation documents (app/api/openapi.py)
    assert set(operation["responses"]) == {"200", "400", "401", "403", "404", "503"}
    assert "prompts.read_prompt_text" in operation["description"]
