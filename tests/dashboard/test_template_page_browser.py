"""The Templates list and a template's page in Debian's chromium, nothing reachable but the test server:
the charts drawn with the versions' markers, a marker reached by keyboard and clicked opens the
version's diff and effect; light and dark (screenshots to look at)."""

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect
from pytest_django.live_server_helper import LiveServer

from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, browser, luminance, offline_page
from tests.dashboard.test_server_page_browser import INKED
from tests.support.template_traffic import a_template_history

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
__all__ = ["browser"]  # the fixture, shared with the other browser tests


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_templates_page_draws_its_versions_and_opens_one(
    browser: Browser, live_server: LiveServer, scheme: Scheme, tmp_path: Path
) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    history = a_template_history(tmp_path)
    page, blocked = offline_page(browser, live_server, scheme=scheme, user="operator")
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(f"{live_server.url}/templates/")
    expect(page.locator(f"#template-{history.support.pk}")).to_contain_text("50.0 %")
    trends = page.locator('#template-list figure[data-chart="spark"][data-drawn="true"] canvas')
    expect(trends).to_have_count(2)  # support and billing: drawn by uPlot, as the Fleet page's
    assert all(trends.nth(i).evaluate(INKED) > 20 for i in range(2))  # a line across
    page.locator("#trend-numbers summary").click()
    expect(page.locator("#trend-numbers tbody tr").first).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    page.screenshot(path=str(SCREENSHOTS / f"templates-trends-{scheme}.png"), full_page=True)
    page.get_by_role("link", name="Hit rate").click()  # sortable: descending first
    page.wait_for_url("**sort=-hit_rate**")
    expect(page.locator("#template-list tbody tr").first).to_contain_text("support")
    page.screenshot(path=str(SCREENSHOTS / f"templates-{scheme}.png"), full_page=True)
    if scheme == "dark":
        assert luminance(page.evaluate("getComputedStyle(document.body).backgroundColor")) < 0.2

    page.get_by_role("link", name="support").click()
    expect(page.locator('figure[data-chart][data-drawn="true"]')).to_have_count(5)  # 4 and the versions'
    markers = page.locator("#chart-hit-rate a.chart-marker")
    expect(markers).to_have_count(2)
    two = page.locator(f'#chart-hit-rate a.chart-marker[data-version="{history.two.pk}"]')
    one = page.locator(f'#chart-hit-rate a.chart-marker[data-version="{history.one.pk}"]')
    assert two.bounding_box()["x"] > one.bounding_box()["x"]  # type: ignore[index]  # later, further right
    page.screenshot(path=str(SCREENSHOTS / f"template-{scheme}.png"), full_page=True)

    two.focus()  # a keyboard stop: Enter opens it as a click does
    # A redraw between the Tab and the Enter (a full-page screenshot resizes the window) makes the
    # markers anew: the focused one's successor takes the focus back, so the Enter is not lost.
    page.evaluate("window.markerBefore = document.activeElement; window.dispatchEvent(new Event('resize'))")
    page.wait_for_function("!document.contains(window.markerBefore)")
    assert page.evaluate("document.activeElement.dataset.version") == str(history.two.pk)
    page.keyboard.press("Enter")
    expect(page.locator("#version-panel")).to_contain_text("-60.0 percentage points")
    expect(page.locator("#version-panel pre.diff .diff-moved-to")).to_contain_text("Current time")
    expect(page.locator("#version-panel pre.diff .diff-added")).to_contain_text("Be kind.")
    assert f"version={history.two.pk}" in page.url  # the version in the URL, to share
    page.locator("#version-panel").screenshot(path=str(SCREENSHOTS / f"template-version-{scheme}.png"))

    page.reload()  # the shared URL shows the same version
    expect(page.locator("#version-panel")).to_contain_text("-60.0 percentage points")
    assert errors == [] and blocked == []
