"""A template's versions table shows each version's template check (its verdict and first finding, its
predicted tokens, money and GPU time an hour) beside what was observed after it went live, their
difference, and a chart of the two per version; a version never checked says so."""

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from app.prompts.models import TemplateVersion, VersionCheck
from app.traffic.models import RequestRecord
from tests.dashboard.test_template_page import row_of
from tests.support.template_traffic import History, a_template_history
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db

FINDING = {"rule": "prefix-shrinks", "level": "error", "line": 1, "token": 3, "variable": "now",
           "class": "timestamp", "message": "the stable prefix ends at `now` (timestamp)"}  # fmt: skip


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


@pytest.fixture
def history(tmp_path: Path) -> History:
    return a_template_history(tmp_path)


def a_check(version: TemplateVersion, **fields: object) -> VersionCheck:
    # The import checked the version already (app/prompts/version_checks.py): these figures replace it.
    check, _ = VersionCheck.objects.update_or_create(
        version=version, defaults={"checked_at": version.committed_at, **fields}
    )
    return check


def cells(html: str, version: TemplateVersion) -> list[str]:
    """The cells of the version's row, a line break read as " / "."""
    return row_of(html.replace("<br>", " / "), f"version-row-{version.pk}")


def reused_per_request(**where: object) -> float:
    found = RequestRecord.objects.filter(**where).aggregate(cached=Sum("cached_tokens"), n=Sum(1))
    return float(found["cached"] / found["n"])


def test_a_checked_version_shows_its_prediction_beside_what_was_observed(
    signed_in: Client, history: History
) -> None:
    VersionCheck.objects.filter(version=history.one).delete()  # as a version imported before checks were
    a_check(history.two, verdict="failed", findings=[{**FINDING, "level": "note", "line": 4}, FINDING],
            base_blocks=3, head_blocks=0, requests_per_hour=60.0, predicted_tokens_per_hour=30_000.0,
            predicted_gpu_seconds_per_hour=12.3, predicted_cost_per_hour=0.0123)  # fmt: skip
    asked_at = timezone.now()
    html = signed_in.get(f"/templates/{history.support.pk}/").content.decode()

    found = cells(html, history.two)
    assert found[4] == "failed / line 1: the stable prefix ends at `now` (timestamp)"
    assert found[5] == "+30,000 / $0.01/h · 12 GPU-s/h"
    # Version two went live ten minutes in (version one at the start): from then to the page's minute.
    live = history.start + timedelta(minutes=10)
    before = reused_per_request(template=history.support, arrived_at__lt=live)
    after = reused_per_request(template=history.support, arrived_at__gte=live)
    requests = RequestRecord.objects.filter(template=history.support, arrived_at__gte=live).count()
    assert (before, after, requests) == (800, 200, 20)
    # Twenty minutes, or one more when the clock turned a minute while the page was made.
    minutes = (asked_at.replace(second=0, microsecond=0) - live) // timedelta(minutes=1)
    chart = json.loads(re.search(r'id="checks-data"[^>]*>(.*?)</script>', html, re.S).group(1))  # type: ignore[union-attr]
    drawn = chart["series"][1]["values"][0]
    observed = next(
        o
        for m in (minutes, minutes + 1)
        if (o := (before - after) * requests * 60 / m) == pytest.approx(drawn)
    )
    assert found[6] == f"+{observed:,.0f}"
    assert found[7] == f"+{observed - 30_000:,.0f} ({100 * (observed - 30_000) / 30_000:+.0f} %)"
    assert chart["kind"] == "bars" and chart["categories"] == [history.two.commit_sha[:7]]
    assert chart["series"][0]["values"] == [30_000.0]
    # Version one, not checked, went live with no traffic in the hour before it.
    assert cells(html, history.one)[4:8] == ["not checked", "—", "— / too little traffic", "—"]


def test_a_check_that_could_not_run_says_why_and_one_without_traffic_is_not_priced(
    signed_in: Client, history: History
) -> None:
    a_check(history.two, verdict="error", error="prefixscope.yaml: samples: a list is needed")
    a_check(history.one, verdict="passed")

    html = signed_in.get(f"/templates/{history.support.pk}/").content.decode()

    two = cells(html, history.two)
    assert two[4] == "could not run / prefixscope.yaml: samples: a list is needed"
    assert two[5] == "— / not priced" and two[7] == "—"
    assert cells(html, history.one)[4:6] == ["passed", "— / not priced"]
