"""The versions table of a template's page in Debian's chromium: each version's check beside its
observed effect, and the bar chart of predicted vs observed per version drawn by uPlot, light and dark
(screenshots to look at)."""

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect
from pytest_django.live_server_helper import LiveServer

from app.prompts.models import VersionCheck
from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, browser, offline_page
from tests.dashboard.test_server_page_browser import INKED
from tests.dashboard.test_template_checks import FINDING
from tests.support.template_traffic import a_template_history

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
__all__ = ["browser"]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_versions_show_predicted_beside_observed_and_draw_both(
    browser: Browser, live_server: LiveServer, scheme: Scheme, tmp_path: Path
) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    history = a_template_history(tmp_path)
    # The import checked both versions already: these figures replace its.
    VersionCheck.objects.update_or_create(version=history.two, defaults=dict(
        checked_at=history.two.committed_at, verdict="failed", findings=[FINDING],
        base_blocks=3, head_blocks=0, requests_per_hour=60.0, predicted_tokens_per_hour=30_000.0,
        predicted_gpu_seconds_per_hour=12.3, predicted_cost_per_hour=0.0123,
    ))  # fmt: skip
    VersionCheck.objects.update_or_create(
        version=history.one, defaults={"checked_at": history.one.committed_at, "verdict": "passed"}
    )
    page, blocked = offline_page(browser, live_server, scheme=scheme, user="operator")
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(f"{live_server.url}/templates/{history.support.pk}/#versions")

    row = page.locator(f"#version-row-{history.two.pk}")
    expect(row).to_contain_text("failed")
    expect(row).to_contain_text("line 1: the stable prefix ends at `now` (timestamp)")
    expect(row).to_contain_text("+30,000")
    chart = page.locator('#chart-checks[data-drawn="true"] canvas')
    expect(chart).to_have_count(1)
    assert chart.evaluate(INKED) > 20  # bars drawn
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    page.locator("#versions-panel").screenshot(path=str(SCREENSHOTS / f"template-checks-{scheme}.png"))
    assert errors == [] and blocked == []
