"""The requests explorer in Debian's chromium, light and dark: filter, the next page, a request's page.
Screenshots in SCREENSHOTS (requests-*.png), to look at."""

import re

import pytest
from playwright.sync_api import Browser, expect
from pytest_django.live_server_helper import LiveServer

from app.traffic.explorer import PAGE_SIZE
from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, browser, offline_page
from tests.support.explorer_traffic import record_traffic

__all__ = ["browser"]  # the fixture, imported for pytest

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_an_engineer_filters_pages_and_opens_a_request(
    browser: Browser, live_server: LiveServer, scheme: Scheme
) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    record_traffic(count=2 * PAGE_SIZE + 30)
    page, blocked = offline_page(browser, live_server, scheme=scheme, user="operator")
    page.goto(f"{live_server.url}/")
    page.get_by_role("link", name="Requests", exact=True).click()
    expect(page.locator("#request-rows tbody tr")).to_have_count(PAGE_SIZE)

    page.get_by_label("Tenant").fill("acme")
    page.get_by_label("Missed only").check()
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"tenant=acme.*missed=on|missed=on.*tenant=acme"))
    rows = page.locator("#request-rows tbody tr")
    expect(rows.first).to_be_visible()
    expect(rows.filter(has_text="globex")).to_have_count(0)
    page.screenshot(path=str(SCREENSHOTS / f"requests-filtered-{scheme}.png"), full_page=True)

    page.get_by_label("Tenant").fill("")
    page.get_by_label("Missed only").uncheck()
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"/requests/\?(?!.*tenant=acme)"))
    first = page.locator("#request-rows tbody tr td:nth-child(3)").first.inner_text()
    page.get_by_role("link", name="Older requests →").click()
    expect(page).to_have_url(re.compile(r"cursor="))
    expect(page.get_by_role("link", name="Back to the newest")).to_be_visible()
    assert page.locator("#request-rows tbody tr td:nth-child(3)").first.inner_text() != first
    page.screenshot(path=str(SCREENSHOTS / f"requests-page-2-{scheme}.png"), full_page=True)

    page.reload()  # the URL alone holds the view: the same page comes back
    expect(page.get_by_role("link", name="Back to the newest")).to_be_visible()
    page.locator("#request-rows tbody tr td:nth-child(3) a").first.click()
    expect(page.get_by_role("heading", name="Block chain")).to_be_visible()
    expect(page.get_by_role("button", name="Compare with it")).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / f"requests-detail-{scheme}.png"), full_page=True)
    assert blocked == []
