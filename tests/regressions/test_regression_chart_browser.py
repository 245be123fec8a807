"""A regression's page draws its drop in Debian's chromium, light and dark: the demo's `volatile_top`
commit (its hit rate, the change point, the suspect's marker) and a capacity cut on virtual-3 (its
server's blocks and evictions), its servers' /metrics pulled as a deployment pulls them. Screenshots
under the test's tmp dir, to look at."""

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect
from pytest_django.live_server_helper import LiveServer

from app.regressions.models import Regression
from tests.core.test_pages_browser import CHROMIUM, Scheme, offline_page
from tests.core.test_pages_browser import browser as browser  # the fixture
from tests.regressions.test_detection import demo, detected

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
# Where the change marker sits across the plot, as a share of its width: drawn, and as its numbers
# place it (the first minute to the last).
MARKER_SHARES = """figure => { const over = figure.querySelector(".u-over").getBoundingClientRect();
  const marker = figure.querySelector("a.chart-marker.change").getBoundingClientRect();
  const data = JSON.parse(figure.querySelector("script").textContent);
  const [first, last] = [data.times[0], data.times[data.times.length - 1]].map(Date.parse);
  const change = Date.parse(data.markers.find(m => m.kind === "change").at);
  return [(marker.left + marker.width / 2 - over.left) / over.width, (change - first) / (last - first)]; }"""


def test_the_regression_page_draws_the_drop_in_light_and_dark(
    browser: Browser, live_server: LiveServer, tmp_path: Path
) -> None:
    timeline = [demo()["timeline"][0], {"at": 480, "capacity_cut": {"server": 3, "num_blocks": 28}}]
    detected(demo(duration=780, timeline=timeline), tmp_path, scrape_every=30)
    commit = Regression.objects.get(kind=Regression.Kind.TEMPLATE_COMMIT, template__name="support")
    cut = Regression.objects.get(kind=Regression.Kind.CAPACITY, server__name="virtual-3")
    screens = tmp_path / "screens"
    screens.mkdir()
    schemes: tuple[Scheme, ...] = ("light", "dark")
    for scheme in schemes:
        page, blocked = offline_page(browser, live_server, scheme=scheme, user="engineer")
        page.goto(f"{live_server.url}/regressions/{commit.pk}/")
        hit_rate = page.locator("figure#chart-hit-rate")
        expect(hit_rate).to_have_attribute("data-drawn", "true")
        change = hit_rate.locator("a.chart-marker.change")
        expect(change).to_have_attribute("aria-label", f"Change point {commit.changed_at:%Y-%m-%d %H:%M} UTC")
        suspect = hit_rate.locator(f'a.chart-marker[data-version="{commit.suspect_version_id}"]')
        title = suspect.get_attribute("title") or ""
        expect(suspect).to_have_attribute("aria-label", f"Version {title}")
        assert "(the suspect)" in title
        drawn, placed = hit_rate.evaluate(MARKER_SHARES)
        assert 0.2 < placed < 0.9 and drawn == pytest.approx(placed, abs=0.02), (drawn, placed)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        page.screenshot(path=str(screens / f"regpage-commit-{scheme}.png"), full_page=True)
        change.focus()  # a keyboard stop: Tab from it reaches the suspect's marker
        page.keyboard.press("Tab")
        expect(suspect).to_be_focused()

        page.goto(f"{live_server.url}/regressions/{cut.pk}/")
        for slug in ("hit-rate", "evictions"):
            figure = page.locator(f"figure#chart-{slug}")
            expect(figure).to_have_attribute("data-drawn", "true")
            expect(figure.locator("a.chart-marker.change")).to_have_count(1)
        expect(page.locator("table.capacity")).to_contain_text("256")
        expect(page.locator("table.capacity")).to_contain_text("28")
        expect(page.locator("#figures")).to_contain_text("Capacity: no template version")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        page.screenshot(path=str(screens / f"regpage-capacity-{scheme}.png"), full_page=True)
        assert blocked == []
