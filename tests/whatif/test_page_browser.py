"""The What-if page in Debian's chromium, nothing reachable but the test server: the calibration's
badge, the capacity curve and the routing bars drawn, light and dark, no horizontal scroll
(screenshots to look at)."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect
from pytest_django.live_server_helper import LiveServer

import app.whatif.tasks  # noqa: F401 - registers the task a question queues (eager here)
from app.whatif.shown import TIMES
from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, browser, luminance, offline_page
from tests.dashboard.test_server_page_browser import INKED
from tests.support.virtual_fleet import run_virtually
from tests.whatif.test_ask import demo

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("eager"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
__all__ = ["browser"]  # the fixture, shared with the other browser tests
SHOTS = Path(os.environ.get("PREFIXSCOPE_WHATIF_SHOTS", str(SCREENSHOTS)))


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_what_if_page_draws_its_curve_and_its_routing_bars(
    browser: Browser, live_server: LiveServer, scheme: Scheme, tmp_path: Path
) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    cut = [{"at": 60, "capacity_cut": {"server": 3, "num_blocks": 28}}]
    run = run_virtually(demo(240, cut), tmp_path, scrape_every=15)
    page, blocked = offline_page(browser, live_server, scheme=scheme, user="operator")
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    window = f"since={run.at(75):%Y-%m-%dT%H:%M:%SZ}&until={run.at(241):%Y-%m-%dT%H:%M:%SZ}"

    page.goto(f"{live_server.url}/whatif/?scope=fleet&{window}")

    expect(page.locator("#calibration .badge")).to_have_text("good")
    drawn = page.locator('figure[data-chart][data-drawn="true"] canvas')
    expect(drawn).to_have_count(2)
    assert all(drawn.nth(i).evaluate(INKED) > 2000 for i in range(2))  # axes, a curve, dots, bars
    curve = page.locator("#chart-capacity")
    # The axes say what they are (uPlot draws their labels on the canvas: see the screenshots).
    labels = curve.evaluate("f => f._plot.axes.map(a => a.label)")
    assert labels[0].startswith("KV blocks per server") and labels[1].startswith("Hit rate")
    legend = curve.locator(".u-legend").inner_text()
    assert "restore virtual-3 to 256 blocks" in legend
    # The cursor off the charts, their legends read today's figures, not dashes.
    today = curve.evaluate(  # to a tenth, as in the table (rounded as the page's script rounds)
        "f => (100 * f._data.series.find(s => s.name === 'today').values.find(v => v !== null)).toFixed(1)"
    )
    assert f"1{TIMES}" in legend and f"{today} %" in legend
    routing = page.locator("#chart-routing")
    assert routing.evaluate("f => f._data.categories[f._data.marked[0]]") == "as recorded (today)"
    legend = routing.locator(".u-legend").inner_text()
    assert "Routing policy" in legend and "as recorded (today)" in legend
    expect(page.locator("#whatif-restore")).to_contain_text("Restore virtual-3 to 256 blocks")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    if scheme == "dark":
        assert luminance(page.evaluate("getComputedStyle(document.body).backgroundColor")) < 0.2
        assert luminance(curve.locator(".u-legend").evaluate("e => getComputedStyle(e).color")) > 0.6
    page.screenshot(path=str(SHOTS / f"whatif-{scheme}.png"), full_page=True)
    assert errors == [] and blocked == []
