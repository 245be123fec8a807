"""A template regression's evidence pair in the API: both requests with their server, request id
and template version, the token where the after one departs, and the pair's Compare permalink."""

from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from app.fleet.models import Server
from app.prompts.models import Template, TemplateVersion
from app.regressions.evidence import before_after_pair
from app.regressions.models import Regression
from app.traffic.models import RequestDiagnosis
from app.traffic.services.partitions import ensure_day_partitions
from tests.support.factories import a_server
from tests.support.tokens import reader_bearer

pytestmark = pytest.mark.django_db


def diagnose(
    server: Server, version: TemplateVersion, request_id: str, at: datetime, **fields: object
) -> None:
    ensure_day_partitions(RequestDiagnosis, [at])
    RequestDiagnosis.objects.create(
        server=server,
        request_id=request_id,
        arrived_at=at,
        diagnosed_at=at,
        template=version.template,
        template_version=version,
        tenant="acme",
        prompt_tokens=900,
        **fields,
    )


@pytest.fixture
def changed_at() -> datetime:
    """A template's change: version `aaaa…` served before it, `bbbb…` (departing at token 212) after."""
    now = timezone.now().replace(microsecond=0)
    server = a_server(name="vllm-0")
    template = Template.objects.create(name="support")
    old, new = (
        TemplateVersion.objects.create(
            template=template, commit_sha=c * 40, committed_at=now - timedelta(hours=1)
        )
        for c in "ab"
    )
    diagnose(server, old, "before-1", now - timedelta(minutes=20))
    diagnose(server, new, "after-1", now - timedelta(minutes=5), cause="prompt_changed", diverged_at=212)
    return now - timedelta(minutes=10)


def test_the_pair_is_stored_with_each_requests_version(changed_at: datetime) -> None:
    template = Template.objects.get()
    pair = before_after_pair(template.pk, changed_at=changed_at, now=timezone.now())
    assert (pair["before"]["version"], pair["after"]["version"]) == ("a" * 40, "b" * 40)


@pytest.mark.parametrize("stored_versions", [True, False], ids=["stored", "stored-before-versions-were"])
def test_the_api_answers_the_pair_and_its_compare_permalink(
    changed_at: datetime, stored_versions: bool
) -> None:
    pair = before_after_pair(Template.objects.get().pk, changed_at=changed_at, now=timezone.now())
    pair["compare_slug"] = "k3yPa1r"  # what Compare saves when both records are still kept
    if not stored_versions:
        for side in ("before", "after"):
            del pair[side]["version"]
    regression = Regression.objects.create(
        scope=Regression.Scope.TEMPLATE,
        template=Template.objects.get(),
        changed_at=changed_at,
        detected_at=changed_at,
        updated_at=changed_at,
        rate_before=0.9,
        rate_after=0.2,
        rate_now=0.2,
        requests_before=40,
        requests_after=40,
        confidence=0.99,
        evidence={"pair": pair},
    )
    answer = Client().get(f"/api/v1/regressions/{regression.pk}", headers=reader_bearer()).json()["pair"]
    assert {k: answer["before"][k] for k in ("server", "request_id", "version")} == {
        "server": "vllm-0", "request_id": "before-1", "version": "a" * 40
    }  # fmt: skip
    assert (answer["after"]["request_id"], answer["after"]["version"]) == ("after-1", "b" * 40)
    assert answer["departs_at_token"] == 212
    assert answer["compare_slug"] == "k3yPa1r"
    assert answer["compare_url"] == "http://testserver/compare/k3yPa1r/"


def test_a_regression_without_a_pair_answers_null(changed_at: datetime) -> None:
    regression = Regression.objects.create(
        scope=Regression.Scope.SERVER,
        server=Server.objects.get(),
        changed_at=changed_at,
        detected_at=changed_at,
        updated_at=changed_at,
        rate_before=0.9,
        rate_after=0.2,
        rate_now=0.2,
        requests_before=40,
        requests_after=40,
        confidence=0.99,
    )
    assert (
        Client().get(f"/api/v1/regressions/{regression.pk}", headers=reader_bearer()).json()["pair"] is None
    )
