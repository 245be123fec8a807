"""A server's page in Debian's chromium with nothing reachable but the test server: uPlot (from
node_modules, as static files) draws every chart, in light and dark (screenshots to look at)."""

from collections.abc import Callable

import pytest
from playwright.sync_api import Browser, Page, expect
from pytest_django.live_server_helper import LiveServer

from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, browser, luminance, offline_page
from tests.support.server_traffic import a_served_server

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
__all__ = ["browser"]  # the fixture, shared with the other browser tests

# How many pixels of a chart's canvas are not the background: lines were drawn on it.
INKED = """canvas => {
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0;
  for (let i = 3; i < data.length; i += 4) if (data[i] > 0) inked++;
  return inked;
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_server_page_draws_its_charts_offline(
    browser: Browser, live_server: LiveServer, scheme: Scheme
) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    server, _ = a_served_server()
    page, blocked = offline_page(browser, live_server, scheme=scheme, user="operator")
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(f"{live_server.url}/servers/{server.pk}/")

    expect(page.locator('figure[data-chart][data-drawn="true"]')).to_have_count(5)
    # No request of this server was diagnosed: its lost-tokens chart says so rather than draw nothing.
    expect(page.locator('#chart-lost-tokens[data-drawn="empty"]')).to_contain_text("Nothing in this window")
    canvas = page.locator("#chart-hit-rate canvas")
    assert canvas.evaluate(INKED) > 500  # axes, grid and two lines
    legend = page.locator("#chart-hit-rate .u-legend").inner_text()
    assert "vLLM prefix-cache counters" in legend
    # The cursor off the chart, its legend reads the latest moment with a figure, not dashes.
    values = page.locator("#chart-hit-rate .u-legend .u-value").all_inner_texts()
    assert values[0].startswith("20") and any(value.endswith(" %") for value in values[1:])
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    if scheme == "dark":
        assert luminance(background) < 0.2
        axis_text = page.locator("#chart-hit-rate .u-legend").evaluate("e => getComputedStyle(e).color")
        assert luminance(axis_text) > 0.6  # the legend readable on the dark page
    page.locator("#chart-ttft summary").click()
    expect(page.locator("#chart-ttft table tbody tr").first).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / f"server-{scheme}.png"), full_page=True)

    # A chart may also read its numbers from the series API (data-src) rather than from the page.
    page.evaluate(
        """url => {
        const figure = document.createElement("figure");
        figure.id = "from-api"; figure.dataset.chart = ""; figure.dataset.src = url;
        figure.innerHTML = '<div class="chart-canvas"></div>';
        document.querySelector(".charts").append(figure);
        document.dispatchEvent(new Event("htmx:afterSettle"));
    }""",
        f"/api/v1/series?metric=hit_rate&scope=server&id={server.pk}",
    )
    expect(page.locator('#from-api[data-drawn="true"] canvas')).to_have_count(1)

    page.get_by_label("7d").check()  # the picker, as a person would use it: the window goes into the URL
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**window=7d**")
    expect(page.locator('figure[data-chart][data-drawn="true"]')).to_have_count(5)
    page.screenshot(path=str(SCREENSHOTS / f"server-7d-{scheme}.png"))
    assert errors == [] and blocked == []


FOCUSED = "() => { const e = document.activeElement; return [e.tagName, e.name || '', e.textContent.trim()] }"


def tab_to(page: Page, wanted: Callable[[list[str]], bool], *, most: int = 40) -> None:
    """Press Tab until the focused element is the one wanted, as a keyboard user would."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if wanted(page.evaluate(FOCUSED)):
            return
    raise AssertionError(f"not reached in {most} tabs; at {page.evaluate(FOCUSED)}")


def test_the_server_page_is_used_from_the_keyboard(browser: Browser, live_server: LiveServer) -> None:
    server, _ = a_served_server()
    page, blocked = offline_page(browser, live_server, user="operator")
    page.goto(f"{live_server.url}/servers/{server.pk}/")
    expect(page.locator('figure[data-chart][data-drawn="true"]')).to_have_count(5)

    page.keyboard.press("Tab")  # the first stop skips the nav's links
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    expect(skip).to_be_in_viewport()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()

    # A date changed in From chooses a custom window: the preset checked before does not win.
    # The minutes field: from 00 it wraps to 59 of the same hour, still before the default window's
    # end; an hour field at 00 (the hour after midnight UTC) would wrap to 23, a time to come.
    tab_to(page, lambda focused: focused[1] == "since")
    for _ in range(4):  # month, day, year, hour: to the minutes
        page.keyboard.press("Tab")
    before = page.locator('input[name="since"]').input_value()
    page.keyboard.press("ArrowDown")
    since = page.locator('input[name="since"]').input_value()
    assert since != before
    expect(page.get_by_label("custom")).to_be_checked()
    tab_to(page, lambda focused: focused[0] == "BUTTON" and focused[2] == "Show")
    page.keyboard.press("Enter")
    page.wait_for_url("**window=custom**")
    expect(page.locator('input[name="since"]')).to_have_value(since)
    expect(page.locator("main")).to_contain_text(since.replace("T", " ")[:16] + " to ")

    # A chart's numbers without a mouse: its table opens from the keyboard.
    tab_to(page, lambda focused: focused[0] == "SUMMARY")
    page.keyboard.press("Enter")
    expect(page.locator("#chart-hit-rate table tbody tr").first).to_be_visible()
    assert blocked == []
