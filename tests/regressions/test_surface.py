"""A regression found in the demo's traffic (its `volatile_top` commit on `support`), read through the
REST API and its pages, and acknowledged by a person."""

from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from app.api.services import create_ingest_token
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from app.traffic.models import RequestDiagnosis
from tests.regressions.test_detection import demo, fault_commit
from tests.support.tokens import reader_bearer
from tests.support.users import fleet_viewer
from tests.support.virtual_fleet import PREFILL_TOKENS_PER_SECOND, VirtualRun, run_virtually

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def found(tmp_path: Path) -> VirtualRun:
    definition = demo(duration=540, timeline=demo()["timeline"][:1])  # volatile_top at minute 5
    return run_virtually(definition, tmp_path, every_minute=lambda now: detect_regressions(now=now))


def _get(client: Client, path: str, headers: dict[str, str]) -> Any:
    response = client.get(path, headers=headers)
    assert response.status_code == 200, response.content
    return response.json()


def test_the_api_lists_a_regression_with_its_suspect_cause_shift_and_cost(found: VirtualRun) -> None:
    bearer = reader_bearer()
    client = Client()

    listed = _get(client, "/api/v1/regressions", bearer)
    assert [(r["scope"], r["template"], r["kind"]) for r in listed["items"]] == [
        ("template", "support", "template_commit")
    ]
    one = _get(client, f"/api/v1/regressions/{listed['items'][0]['id']}", bearer)
    assert one["suspect_commit_sha"] == fault_commit(found, "support", 300)
    assert one["candidates"][0]["commit_sha"] == one["suspect_commit_sha"]
    assert one["cause_shift"]["after"]["prompt_changed"] > one["cause_shift"]["before"].get(
        "prompt_changed", 0
    )
    # The prefill rate measured from the records' TTFTs: what the simulated servers take per token.
    assert one["cost"]["prefill_rate_source"] == "measured"
    assert one["cost"]["prefill_tokens_per_second"] == pytest.approx(PREFILL_TOKENS_PER_SECOND, rel=0.05)
    assert one["cost"]["gpu_seconds_per_hour"] == pytest.approx(
        one["cost"]["lost_tokens_per_hour"] / one["cost"]["prefill_tokens_per_second"]
    )
    assert one["method"]["min_drop"] == 0.15
    assert (one["metric"], one["ttft"], one["resolution"]) == ("hit_rate", None, "")
    assert _get(client, "/api/v1/regressions?scope=server", bearer)["items"] == []
    exported = client.get("/metrics").content.decode()
    labels = 'expected="false",kind="template_commit",metric="hit_rate",name="support",'
    labels += 'owner="templates",owner_kind="template",scope="template",server="",state="open",'
    labels += 'template="support"'
    assert f"prefixscope_regression_active{{{labels}}} 1.0" in exported
    assert client.get("/api/v1/regressions").status_code == 401
    assert client.get("/api/v1/regressions/999999", headers=bearer).status_code == 404
    assert client.get("/api/v1/regressions?state=bogus", headers=bearer).status_code == 400


def test_a_person_acknowledges_it_with_a_note_on_its_page_and_through_the_api(found: VirtualRun) -> None:
    regression = Regression.objects.get()
    client = Client(enforce_csrf_checks=False)
    client.force_login(fleet_viewer("engineer"))

    page = client.get(reverse("regressions:detail", args=[regression.pk]))
    assert page.status_code == 200
    assert fault_commit(found, "support", 300)[:12].encode() in page.content
    assert b"<td>Prompt changed</td>" in page.content  # the cause shift, named as elsewhere
    pair = regression.evidence["pair"]
    after = RequestDiagnosis.objects.get(request_id=pair["after"]["request_id"])
    before = RequestDiagnosis.objects.get(request_id=pair["before"]["request_id"])
    assert after.template_version == regression.suspect_version != before.template_version
    assert before.arrived_at < after.arrived_at and pair["diverged_at"] == 0  # the new first line
    assert f"version before at token <strong>{pair['diverged_at']}</strong>".encode() in page.content
    assert client.get(reverse("compare:detail", args=[pair["compare_slug"]])).status_code == 200
    assert b'" class="diff-moved-to"' in page.content  # the suspect commit's diff, its moved line marked

    noted = client.post(
        reverse("regressions:detail", args=[regression.pk]),
        {"state": "acknowledged", "note": "on it"},
        follow=True,
    )
    # Back on its page, saying so: the message is not left for whichever page shows messages next.
    assert f"Regression {regression.pk}: acknowledged.".encode() in noted.content
    assert b"Acknowledged: on it" in noted.content
    regression.refresh_from_db()
    assert (regression.state, regression.note) == ("acknowledged", "on it")
    assert regression.noted_by is not None and regression.noted_by.username == "engineer"
    assert client.get(reverse("regressions:list")).content.count(b"support") >= 1  # still active

    muted = client.post(
        f"/api/v1/regressions/{regression.pk}/note",
        {"state": "muted", "note": "known"},
        content_type="application/json",
    )
    assert muted.status_code == 200 and muted.json()["state"] == "muted"
    bearer = {"Authorization": f"Bearer {create_ingest_token(name='ci')}"}
    refused = Client().post(
        f"/api/v1/regressions/{regression.pk}/note",
        {"state": "open"},
        content_type="application/json",
        headers=bearer,
    )
    assert refused.status_code == 401  # a note is a person's: no ingest token
