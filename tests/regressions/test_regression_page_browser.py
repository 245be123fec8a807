"""A TTFT regression's page, a reverted one's and a routing change's, in Debian's chromium, light and
dark (screenshots in SCREENSHOTS, to look at): the demo's `volatile_top` commit reverted five minutes
later, then a server slowing down eight minutes later; the router switched to round-robin."""

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect
from pytest_django.live_server_helper import LiveServer

from app.regressions.models import Regression
from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, offline_page
from tests.core.test_pages_browser import browser as browser  # the fixture
from tests.regressions.test_detection import demo, detected
from tests.regressions.test_routing import routing_change

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]

SUPPORT_TEXT = next(t["text"] for t in demo()["templates"] if t["name"] == "support")


def test_a_ttft_regression_and_a_reverted_one_read_in_light_and_dark(
    browser: Browser, live_server: LiveServer, tmp_path: Path
) -> None:
    revert = {
        "at": 600,
        "template": "support",
        "change": {"message": "Revert the time", "text": SUPPORT_TEXT},
    }
    detected(
        demo(duration=1560, timeline=[demo()["timeline"][0], revert]),
        tmp_path,
        # Eight minutes after the revert: the server's TTFT has five points of its level before.
        ttft_factor=lambda request: 3.0 if request.server == 1 and request.at >= 1080 else 1.0,
    )
    reverted = Regression.objects.get(metric=Regression.Metric.HIT_RATE, template__name="support")
    slow = Regression.objects.get(metric=Regression.Metric.TTFT)
    SCREENSHOTS.mkdir(exist_ok=True)
    schemes: tuple[Scheme, ...] = ("light", "dark")
    for scheme in schemes:
        page, blocked = offline_page(browser, live_server, scheme=scheme, user="engineer")
        page.goto(f"{live_server.url}/regressions/{slow.pk}/")
        expect(page.locator("h1")).to_have_text("TTFT p90 rise on server virtual-1")
        expect(page.locator("main")).to_contain_text("as the clients saw it")
        page.screenshot(path=str(SCREENSHOTS / f"regression-ttft-{scheme}.png"), full_page=True)
        page.goto(f"{live_server.url}/regressions/{reverted.pk}/")
        expect(page.locator("main")).to_contain_text("its suspect commit was reverted")
        page.screenshot(path=str(SCREENSHOTS / f"regression-reverted-{scheme}.png"), full_page=True)
        page.goto(f"{live_server.url}/regressions/?state=all")
        expect(page.locator("tbody tr")).to_have_count(2)
        expect(page.locator("tbody")).to_contain_text("TTFT p90")
        expect(page.locator("tbody")).to_contain_text("(version reverted)")
        page.screenshot(path=str(SCREENSHOTS / f"regressions-{scheme}.png"), full_page=True)
        assert blocked == []


def test_a_routing_regression_reads_in_light_and_dark(
    browser: Browser, live_server: LiveServer, tmp_path: Path
) -> None:
    detected(routing_change(), tmp_path)
    routing = Regression.objects.get(kind=Regression.Kind.ROUTING)
    SCREENSHOTS.mkdir(exist_ok=True)
    schemes: tuple[Scheme, ...] = ("light", "dark")
    for scheme in schemes:
        page, blocked = offline_page(browser, live_server, scheme=scheme, user="engineer")
        page.goto(f"{live_server.url}/regressions/{routing.pk}/")
        expect(page.locator("h1")).to_have_text("Routing change on the fleet")
        expect(page.locator("main")).to_contain_text("landed on the servers they had landed on before")
        expect(page.locator("table#causes thead")).to_contain_text("since the change")
        page.screenshot(path=str(SCREENSHOTS / f"regression-routing-{scheme}.png"), full_page=True)
        assert blocked == []
