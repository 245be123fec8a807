"""The Compare page in Debian's chromium: the divergence is marked, and n / p walk the edits."""

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from django.conf import settings
from django.db import connections
from django.test import Client
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect, sync_playwright
from pytest_django.live_server_helper import LiveServer

from app.compare.services import SideInput, create_comparison
from app.compare.tokenization import Prompt
from app.fleet.models import Server
from tests.compare.conftest import Record, capture, prompt_ids, prompt_reader
from tests.core.test_pages_browser import SCREENSHOTS
from tests.support.users import fleet_viewer

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
SCREENSHOT = SCREENSHOTS / "compare-page.png"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    # Playwright's sync API runs an event loop in this thread; the ORM calls of the test and of
    # pytest-django's teardown are still plain synchronous code. Connections opened meanwhile
    # live in the loop's context: closed before leaving it, or they would outlive the test.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()
            connections.close_all()


def _signed_in_page(
    browser: Browser,
    live_server_url: str,
    *,
    color_scheme: Literal["light", "dark"] = "light",
    reads_prompts: bool = True,
) -> Page:
    client = Client()
    user = (
        prompt_reader(f"engineer-{color_scheme}")
        if reads_prompts
        else fleet_viewer(f"operator-{color_scheme}")
    )
    client.force_login(user)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=color_scheme)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_server_url}])
    return context.new_page()


def test_the_timestamp_pair_is_marked_at_token_7_and_n_moves_to_the_next_edit(
    browser: Browser, live_server: LiveServer, record: Record
) -> None:
    a, b = record("timestamp-top-1", offset=1), record("timestamp-top-2", offset=2)
    comparison = create_comparison(
        a=SideInput(record=a), b=SideInput(record=b), now=timezone.now()
    ).comparison
    url = f"{live_server.url}{comparison.get_absolute_url()}"
    page = _signed_in_page(browser, live_server.url)

    page.goto(url)

    first = page.locator("#first-divergence")
    expect(first).to_have_attribute("data-first-divergence", "7")
    expect(first).to_be_visible()
    expect(page.locator("#edit-0 .edit-label")).to_contain_text("first divergence at token 7")
    page.keyboard.press("n")
    expect(page.locator("#edit-0")).to_be_focused()
    page.keyboard.press("n")
    expect(page.locator("#edit-1")).to_be_focused()
    expect(page.locator("#edit-1")).to_be_in_viewport()
    expect(page.locator("#edit-position")).to_have_text("edit 2 of 2")
    page.keyboard.press("k")
    expect(page.locator("#edit-0")).to_be_focused()
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    dark = _signed_in_page(browser, live_server.url, color_scheme="dark")
    dark.goto(url)
    dark.screenshot(path=str(SCREENSHOT.with_name("compare-page-dark.png")), full_page=True)


def test_n_scrolls_to_an_edit_far_down_and_a_fold_opens_in_place(
    browser: Browser, live_server: LiveServer
) -> None:
    base = prompt_ids("salt-a-1")
    a = base * 40  # 7,640 tokens
    b = list(a)
    for position in range(7000, 0, -500):  # 14 one-token edits, far apart
        b[position] = 50_000
    compared = create_comparison(
        a=SideInput(prompt=Prompt(token_ids=tuple(a))),
        b=SideInput(prompt=Prompt(token_ids=tuple(b))),
        block_size=32,
        now=timezone.now(),
    )
    page = _signed_in_page(browser, live_server.url)
    page.goto(f"{live_server.url}{compared.comparison.get_absolute_url()}")

    for _ in range(14):
        page.keyboard.press("j")
    last = page.locator("#edit-13")
    expect(last).to_be_focused()
    expect(last).to_be_in_viewport()
    assert page.evaluate("window.scrollY") > 1000
    page.keyboard.press("p")
    expect(page.locator("#edit-12")).to_be_focused()

    fold = page.locator("a.fold").first
    fold.scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOT.with_name("compare-folds.png")))
    fold_id = fold.get_attribute("id")
    chips_before = page.locator(".t").count()
    fold.click()
    expect(page.locator(f"a#{fold_id}")).to_have_count(0)
    assert page.locator(".t").count() > chips_before
    expect(page.locator(f"span#{fold_id}")).to_be_visible()  # the opened stretch's first token


def test_a_prompt_pasted_in_the_browser_has_the_tokens_vllm_counted(
    browser: Browser, live_server: LiveServer, captured_server: Server
) -> None:
    # The browser itself turns the text box's line breaks into CRLF when it submits the form.
    page = _signed_in_page(browser, live_server.url)
    page.goto(f"{live_server.url}/compare/")
    page.locator("#id_a_prompt").fill(capture("timestamp-top-1")["request"]["prompt"])
    page.locator("#id_b_prompt").fill(capture("timestamp-top-2")["request"]["prompt"])
    page.locator("#id_server").select_option("vllm-cpu")
    page.screenshot(path=str(SCREENSHOT.with_name("compare-start.png")), full_page=True)

    page.get_by_role("button", name="Compare", exact=True).click()

    expect(page.locator(".side-a .muted").first).to_contain_text("208 tokens")  # as vLLM counted them
    expect(page.locator(".side-b .muted").first).to_contain_text("207 tokens")
    expect(page.locator("#first-divergence")).to_have_attribute("data-first-divergence", "7")


def test_compare_with_previous_in_the_explorer_reuses_what_vllm_reported(
    browser: Browser, live_server: LiveServer, record: Record, other_server: Server
) -> None:
    record("salt-a-1", offset=1)
    record("salt-b-1", offset=2)  # another tenant, later: not what salt-a-2 reused
    record("salt-a-1", offset=3, server=other_server)  # another server
    later = record("salt-a-2", offset=4)
    for scheme in ("light", "dark"):
        page = _signed_in_page(browser, live_server.url, color_scheme=scheme)
        page.goto(f"{live_server.url}/compare/")
        page.screenshot(path=str(SCREENSHOT.with_name(f"compare-explorer-{scheme}.png")), full_page=True)

        page.locator(f'button[name="b_previous"][value="{later}"]').click()

        expect(page.locator("#reusable-tokens")).to_have_text("160")  # vLLM's cached_tokens for salt-a-2
        expect(page.locator("#blocked-by")).to_have_count(0)
        expect(page.locator(".side-a .side-label")).to_contain_text("request salt-a-1-1 on vllm-cpu,")
        page.screenshot(path=str(SCREENSHOT.with_name(f"compare-previous-{scheme}.png")), full_page=True)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_without_the_prompt_permission_the_page_shows_the_blocks_and_no_token(
    browser: Browser, live_server: LiveServer, record: Record, scheme: Literal["light", "dark"]
) -> None:
    a, b = record("timestamp-top-1", offset=1), record("timestamp-top-2", offset=2)
    comparison = create_comparison(
        a=SideInput(record=a), b=SideInput(record=b), now=timezone.now()
    ).comparison
    page = _signed_in_page(browser, live_server.url, color_scheme=scheme, reads_prompts=False)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(f"{live_server.url}{comparison.get_absolute_url()}")

    expect(page.locator("#block-table tbody tr").first).to_be_visible()
    expect(page.locator("#edit-positions li")).to_have_count(2)
    expect(page.locator(".t")).to_have_count(0)
    page.keyboard.press("n")  # the keys find no edit to move to, and say nothing wrong
    page.screenshot(path=str(SCREENSHOT.with_name(f"compare-withheld-{scheme}.png")), full_page=True)
    assert "Current time" not in page.content() and errors == []
