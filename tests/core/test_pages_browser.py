"""Prefixscope's pages in Debian's chromium: the API docs with no network, form controls in the
site's colours in light and dark (screenshots in SCREENSHOTS, to look at)."""

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from django.conf import settings
from django.db import connections
from django.test import Client
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright
from pytest_django.live_server_helper import LiveServer

from app.fleet.models import Server
from tests.support.factories import a_server
from tests.support.users import fleet_viewer

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
# Where the browser tests leave their screenshots, to look at (CI keeps them as artifacts).
SCREENSHOTS = Path(os.environ.get("PREFIXSCOPE_SCREENSHOTS", "/tmp/prefixscope-screens"))
Scheme = Literal["light", "dark"]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    # As in tests/compare/test_compare_page_browser.py: the ORM runs beside Playwright's loop.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()
            connections.close_all()


def offline_page(
    browser: Browser, live_server: LiveServer, *, scheme: Scheme = "light", user: str = ""
) -> tuple[Page, list[str]]:
    """A page that reaches only the live server, and the URLs of the other requests it made (each
    aborted). Signed in as a staff user of that name when one is given."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    if user:
        client = Client()
        client.force_login(fleet_viewer(user, is_staff=True))
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_server.url}]
        )
    blocked: list[str] = []

    def only_the_live_server(route: Route) -> None:
        if route.request.url.startswith(live_server.url):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", only_the_live_server)
    return context.new_page(), blocked


def test_the_api_docs_render_their_operations_with_no_network(
    browser: Browser, live_server: LiveServer
) -> None:
    page, blocked = offline_page(browser, live_server)
    page.goto(f"{live_server.url}/api/docs")
    expect(page.locator(".opblock").first).to_be_visible()
    # Two operations on one path: the bulk ingest (POST) and the list (GET).
    expect(page.locator(".opblock-summary-path", has_text=re.compile(r"^/api/v1/requests$"))).to_have_count(2)
    assert page.locator(".opblock").count() >= 2
    assert blocked == []


def luminance(css_colour: str) -> float:
    r, g, b = (int(v) for v in re.findall(r"\d+", css_colour)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


FIELDS = 'input:not([type="hidden"], [type="radio"], [type="checkbox"]), select, textarea'
CONTROLS = f"{FIELDS}, button:not(.link)"
STYLES = "all => all.map(e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).color, e.outerHTML])"
# The site's own background colours (static/css/app.css), as the browser computes them.
PALETTE = """() => ["--bg", "--field", "--button", "--accent"].map(name => {
  const probe = document.body.appendChild(document.createElement("div"));
  probe.style.backgroundColor = `var(${name})`;
  const colour = getComputedStyle(probe).backgroundColor;
  probe.remove();
  return colour;
})"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_form_controls_take_the_sites_colours_in_light_and_dark(
    browser: Browser, live_server: LiveServer, scheme: Scheme
) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    a_server(name="vllm-0", block_size=32)
    Server.objects.create(name="vllm-0-typo", base_url="", state=Server.State.PROPOSED)  # a form to decide
    anonymous, blocked = offline_page(browser, live_server, scheme=scheme)
    staff, blocked_too = offline_page(browser, live_server, scheme=scheme, user="operator")
    pages = {"login": (anonymous, "/login/"), "fleet": (staff, "/"), "compare": (staff, "/compare/"),
             "collection": (staff, "/collection/")}  # fmt: skip
    for name, (page, path) in pages.items():
        page.goto(f"{live_server.url}{path}")
        expect(page.locator("html")).to_have_css("color-scheme", "light dark")
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{scheme}.png"), full_page=True)
        styles = page.eval_on_selector_all(CONTROLS, STYLES)
        palette = set(page.evaluate(PALETTE)) - {"rgba(0, 0, 0, 0)"}
        assert name == "collection" or styles, f"no form controls on {path}"
        for background, text, control in styles:
            assert background in palette, (name, background, palette, control)  # not the browser's own
            readable = abs(luminance(text) - luminance(background)) > 0.4
            assert readable, (name, background, text, control)
            if scheme == "dark":  # never white or light grey
                assert luminance(background) < 0.7, (name, background, control)
    assert blocked == blocked_too == []
