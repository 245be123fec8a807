"""The demo's `volatile_top` regression's page in Debian's chromium, light and dark: its moved line in
a colour of its own, its frozen killers and the webhook's outcome shown, nothing fetched from
elsewhere (screenshots in SCREENSHOTS, to look at)."""

from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, expect
from pytest_django import Settings
from pytest_django.live_server_helper import LiveServer

from app.compare.killers import find_all_killers
from app.fleet.models import Server
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from app.regressions.tasks import notify_webhook
from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, browser, luminance, offline_page
from tests.regressions.test_detection import demo
from tests.support.virtual_fleet import run_virtually
from tests.support.webhook_server import running_webhook

__all__ = ["browser"]  # the fixture, shared
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
COLOURS = """kind => { const line = document.querySelector(`pre.diff .diff-${kind}`);
  return line ? getComputedStyle(line).color : null; }"""


@pytest.fixture
def regression(tmp_path: Path, settings: Settings) -> Regression:
    """The regression, its killers frozen, the webhook told of it (on the loopback)."""
    definition = demo(duration=540, timeline=demo()["timeline"][:1])
    run_virtually(definition, tmp_path, every_minute=lambda now: detect_regressions(now=now))
    Server.objects.update(base_url="")  # decoded by the bundled tokenizer: no virtual server asked
    now = timezone.now()
    find_all_killers(now=now)
    detect_regressions(now=now)
    found = Regression.objects.get()
    with running_webhook() as hook:
        settings.PREFIXSCOPE_REGRESSION_WEBHOOK_URL = hook.url
        notify_webhook.apply(args=(found.pk, "opened"))
    return found


def test_the_regression_page_in_light_and_dark(
    browser: Browser, live_server: LiveServer, regression: Regression, settings: Settings
) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    settings.PREFIXSCOPE_REGRESSION_WEBHOOK_URL = "https://hooks.example/services/x"  # set: its row shown
    for scheme in ("light", "dark"):
        page, blocked = offline_page(browser, live_server, scheme=scheme, user="operator")
        page.goto(f"{live_server.url}/regressions/{regression.pk}/")
        expect(page.locator("pre.diff .diff-moved-to")).to_have_count(1)
        expect(page.locator("pre.diff .diff-moved-from")).to_have_count(1)
        expect(page.locator("table.killers tbody tr").first).to_contain_text("Timestamp or date")
        expect(page.locator("tr", has_text="Webhook")).to_contain_text("Opened: sent")
        page.screenshot(path=str(SCREENSHOTS / f"regression-{scheme}.png"), full_page=True)
        moved, hunk = page.evaluate(COLOURS, "moved-to"), page.evaluate(COLOURS, "hunk")
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert moved not in (hunk, page.evaluate(COLOURS, "context"))
        assert abs(luminance(moved) - luminance(background)) > 0.3, (scheme, moved, background)
        assert blocked == []
