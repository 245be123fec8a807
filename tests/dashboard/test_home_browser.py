"""The Fleet page in Debian's chromium with nothing reachable but the test server: every server's
sparkline drawn by uPlot, again after an htmx refresh, the window picker by keyboard, light and dark
(screenshots to look at)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, expect
from pytest_django.live_server_helper import LiveServer

from app.fleet.models import Server
from app.rollups.servers import refresh_server_minutes
from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, browser, luminance, offline_page
from tests.dashboard.test_server_page_browser import INKED
from tests.support.server_traffic import a_served_server

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
__all__ = ["browser"]


def a_fleet() -> list[Server]:
    """Two served servers (pulls, requests, KV events), one whose pulls stopped, one proposed."""
    served = [a_served_server(name)[0] for name in ("vllm-a", "vllm-b")]
    Server.objects.filter(pk__in=[s.pk for s in served]).update(last_scraped_at=timezone.now())  # up
    Server.objects.create(
        name="vllm-stale", base_url="http://stale:8000", last_scraped_at=timezone.now() - timedelta(hours=2)
    )
    Server.objects.create(name="vllm-typo", base_url="", state=Server.State.PROPOSED)
    refresh_server_minutes(since=timezone.now() - timedelta(hours=1), until=timezone.now())
    return served


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_fleet_page_draws_its_sparklines_and_keeps_them_after_a_refresh(
    browser: Browser, live_server: LiveServer, scheme: Scheme
) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    a_fleet()
    page, blocked = offline_page(browser, live_server, scheme=scheme, user="operator")
    page.set_viewport_size({"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(f"{live_server.url}/")

    sparks = page.locator('figure[data-chart="spark"][data-drawn="true"] canvas')
    expect(sparks).to_have_count(2)
    page.screenshot(path=str(SCREENSHOTS / f"fleet-page-{scheme}.png"), full_page=True)
    inked = [sparks.nth(i).evaluate(INKED) for i in range(2)]
    assert all(n > 20 for n in inked), inked  # a line across
    expect(page.locator("#server-" + str(Server.objects.get(name="vllm-stale").pk))).to_contain_text("stale")
    expect(page.locator('figure[data-chart="spark"][data-drawn="empty"]')).to_have_count(1)  # the stale one
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280  # no sideways scrolling at 1280 px
    if scheme == "dark":
        assert luminance(page.evaluate("getComputedStyle(document.body).backgroundColor")) < 0.2

    # The poll's swap: new rows, sparklines drawn again on them.
    page.evaluate("document.querySelectorAll('figure.spark').forEach((f) => (f.dataset.old = 'yes'))")
    page.evaluate("htmx.trigger(document.body, 'fleet-changed')")
    fresh = page.locator('figure[data-chart="spark"]:not([data-old])[data-drawn="true"] canvas')
    expect(fresh).to_have_count(2)
    expect(page.locator("figure.spark[data-old]")).to_have_count(0)

    # The window picker, by keyboard: the window goes into the URL.
    page.get_by_label("24h").focus()
    page.keyboard.press("Space")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_url("**window=24h**")
    expect(sparks).to_have_count(2)
    page.locator("details.spark-numbers summary").click()
    expect(page.locator("details.spark-numbers tbody tr").first).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / f"fleet-page-24h-{scheme}.png"), full_page=True)
    assert errors == [] and blocked == []
