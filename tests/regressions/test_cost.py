"""One cost model: a regression's cost, the template page's and the API's are the same figure for
the same scope and window (the demo's `support` regression)."""

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client
from django.urls import reverse

from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from app.traffic.models import LossMinute
from tests.regressions.test_detection import demo
from tests.support.tokens import reader_bearer
from tests.support.users import fleet_viewer
from tests.support.virtual_fleet import run_virtually

pytestmark = pytest.mark.django_db(transaction=True)


def _json(client: Client, path: str, **params: str) -> Any:
    response = client.get(path, params, headers=reader_bearer())
    assert response.status_code == 200, response.content
    return response.json()


def test_a_regression_the_template_page_and_the_api_price_one_scope_and_window_alike(tmp_path: Path) -> None:
    definition = demo(duration=540, timeline=demo()["timeline"][:1])  # volatile_top at minute 5
    run_virtually(definition, tmp_path, every_minute=lambda now: detect_regressions(now=now))
    regression = Regression.objects.get(scope="template", template__name="support")
    client = Client()

    cost = _json(client, f"/api/v1/regressions/{regression.pk}")["cost"]
    window = {"since": cost["since"], "until": cost["until"]}
    assert cost["lost_tokens_per_hour"] > 0 and "cold" in cost["counts"]
    asked = _json(client, "/api/v1/cost", scope="template", id="support", **window)
    assert asked["tokens_per_hour"] == pytest.approx(cost["scope_lost_tokens_per_hour"], rel=1e-9)
    assert asked["counts"] == cost["counts"]
    # The headline: of those, the ones over what the scope lost at its rate before, per hour alike.
    since, until = (datetime.fromisoformat(window[end]) for end in ("since", "until"))
    sums = LossMinute.objects.filter(
        template=regression.template, minute__gte=since, minute__lt=until
    ).aggregate(prompt=Sum("diagnosed_prompt_tokens"), reused=Sum("reused_tokens"))
    # At most what was lost: the rate is of all prompt tokens, whose misses before the change were
    # nearly all the requests' own new content (not a loss), so the excess can pass the losses.
    over = min(regression.rate_before * sums["prompt"] - sums["reused"], asked["lost_tokens"])
    assert 0 < over <= asked["lost_tokens"]
    hours = (until - since) / timedelta(hours=1)
    assert cost["lost_tokens_per_hour"] == pytest.approx(over / hours, abs=1 / hours)
    share = cost["lost_tokens_per_hour"] / cost["scope_lost_tokens_per_hour"]
    assert cost["cost_per_hour"] == pytest.approx(asked["money_per_hour"] * share, rel=1e-9)

    client.force_login(fleet_viewer("engineer"))
    detail = client.get(reverse("regressions:detail", args=[regression.pk])).content.decode()
    link = re.search(r'href="([^"]*window=custom[^"]*)">the template page', detail)
    assert link is not None
    page = client.get(link.group(1).replace("&amp;", "&")).content.decode()
    shown = re.search(r'id="template-cost">([\d,]+) in the window, ([\d,]+) an hour', page)
    assert shown is not None, page
    assert int(shown.group(2).replace(",", "")) == round(cost["scope_lost_tokens_per_hour"])
    on_detail = re.search(r'id="regression-scope-cost">([\d,]+)<', detail)
    assert on_detail is not None and on_detail.group(1) == shown.group(2)
    headline = re.search(r'id="regression-cost">([\d,]+) prefill tokens an hour over what', detail)
    assert headline is not None and int(headline.group(1).replace(",", "")) == round(
        cost["lost_tokens_per_hour"]
    )
    assert int(shown.group(1).replace(",", "")) == asked["lost_tokens"]


def test_the_cost_api_answers_a_bad_window_or_scope_with_the_error_shape(db: None) -> None:
    client = Client()
    headers = reader_bearer()
    bad = client.get(
        "/api/v1/cost", {"since": "2026-01-02T00:00Z", "until": "2026-01-01T00:00Z"}, headers=headers
    )
    assert bad.status_code == 400 and bad.json()["message"] == "since must come before until"
    missing = client.get("/api/v1/cost", {"scope": "template", "id": "nope"}, headers=headers)
    assert missing.status_code == 404 and missing.json()["code"]
