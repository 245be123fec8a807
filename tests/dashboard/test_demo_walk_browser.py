"""Every page of the nav and their detail pages, walked in Debian's chromium on the demo fleet's data,
as an admin, light and dark (screenshots in SCREENSHOTS, to look at).

The data is the `demo` scenario's, made the way `make run` makes it but in virtual time
(tests/support/virtual_fleet.py): its requests through the simulator's caches, records ingested,
KV events stored, each server's /metrics pulled every 30 s, and what beat runs each minute (rollups,
diagnosis, regression detection; the cache-killer search every five minutes). So the demo's
`volatile_top` regression on `support`, with its suspect commit, is on the Fleet, template and
regression pages. Each page answers 200, logs no console error, fits 1280 px without sideways
scrolling, and shows its key content.
"""

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from playwright.sync_api import Browser, ConsoleMessage, Page, expect
from pytest_django.live_server_helper import LiveServer

from app.compare.killers import find_all_killers
from app.fleet.models import Server
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from app.rollups.refresh import refresh_minute_rollups
from app.rollups.servers import refresh_server_minutes
from app.rollups.tasks import ROLLUP_LOOKBACK
from app.traffic.models import RequestRecord
from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, browser, luminance, offline_page
from tests.regressions.test_detection import demo, fault_commit
from tests.support.virtual_fleet import VirtualRun, record_scrapes, run_virtually

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
__all__ = ["browser"]  # the fixture, shared with the other browser tests

SCRAPE_EVERY_SECONDS = 30  # twice the default pull interval: half the samples to store, the same charts
KILLERS_EVERY_MINUTES = 5  # beat's compare.find_killers, PREFIXSCOPE_KILLER_EVERY_SECONDS by default


def beat(now: datetime) -> None:
    """What beat runs after each minute's rollups and diagnosis."""
    if now.minute % KILLERS_EVERY_MINUTES == 0:
        find_all_killers(now=now)
    detect_regressions(now=now)


def the_demo_fleet(tmp_path: Path) -> VirtualRun:
    """The demo's 25 minutes, ending about two minutes ago; then a pull of every server now (up, as
    beat keeps them) and the rollups to now."""
    run = run_virtually(demo(), tmp_path, every_minute=beat, scrape_every=SCRAPE_EVERY_SECONDS)
    Server.objects.update(scrape_interval_seconds=SCRAPE_EVERY_SECONDS)  # as they were pulled
    now = timezone.now()
    record_scrapes(run, at=now)
    refresh_minute_rollups(since=now - ROLLUP_LOOKBACK, until=now)
    refresh_server_minutes(since=now - ROLLUP_LOOKBACK, until=now)
    return run


class Walk:
    """One browser page, signed in as an admin, and what went wrong on the way."""

    def __init__(self, page: Page, base: str, scheme: Scheme) -> None:
        self.page, self.base, self.scheme = page, base, scheme
        self.errors: list[str] = []
        self.visited: set[str] = set()
        page.on("pageerror", lambda error: self.errors.append(f"{page.url}: {error}"))
        page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"{self.page.url}: {message.text}")

    def open(self, path: str, name: str, check: Callable[[Page], object]) -> None:
        """Go to `path`: 200, its key content (`check`), charts drawn, 1280 px wide, a screenshot."""
        response = self.page.goto(self.base + path)
        assert response is not None and response.status == 200, (path, response and response.status)
        self.arrived(name, check)

    def arrived(self, name: str, check: Callable[[Page], object]) -> None:
        page = self.page
        self.visited.add(page.url.removeprefix(self.base).split("?")[0].split("#")[0])
        check(page)
        expect(page.locator("figure[data-chart]:not([data-drawn])")).to_have_count(0)  # every chart drawn
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, (name, width)  # no sideways scrolling at 1280 px
        if self.scheme == "dark":
            assert luminance(page.evaluate("getComputedStyle(document.body).backgroundColor")) < 0.2
        page.screenshot(path=str(SCREENSHOTS / f"walk-{name}-{self.scheme}.png"), full_page=True)


def text(*expected: str) -> Callable[[Page], None]:
    """Each of `expected` in the page's main content."""

    def check(page: Page) -> None:
        for fragment in expected:
            expect(page.locator("main")).to_contain_text(fragment)

    return check


def test_every_page_reads_on_the_demo_fleet_in_light_and_dark(
    browser: Browser, live_server: LiveServer, tmp_path: Path
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    run = the_demo_fleet(tmp_path)
    User.objects.create_superuser("admin", password=None)
    schemes: tuple[Scheme, ...] = ("light", "dark")
    for scheme in schemes:
        walk_every_page(browser, live_server, run, scheme)


def walk_every_page(browser: Browser, live_server: LiveServer, run: VirtualRun, scheme: Scheme) -> None:
    support = Regression.objects.get(scope=Regression.Scope.TEMPLATE, template__name="support")
    sha = fault_commit(run, "support", 300)
    assert support.suspect_version is not None and support.suspect_version.commit_sha == sha
    open_count = Regression.objects.filter(state=Regression.State.OPEN).count()
    assert open_count >= 1
    page, blocked = offline_page(browser, live_server, scheme=scheme, user="admin")
    walk = Walk(page, live_server.url, scheme)

    def fleet(page: Page) -> None:
        cards = page.locator(f'a[href="{reverse("regressions:list")}?state=open"]')
        expect(cards).to_have_text(f"{open_count} open")
        for server in run.servers:
            expect(page.locator(f"#server-{server.pk}")).to_contain_text("up")
        expect(page.locator('figure[data-chart="spark"][data-drawn="true"] canvas')).to_have_count(4)

    walk.open("/", "fleet", fleet)
    nav = set(page.eval_on_selector_all("header nav a", "links => links.map(a => a.pathname)"))
    page.locator(f'a[href="{reverse("regressions:list")}?state=open"]').click()  # the card's link
    walk.arrived("regressions", text("Template support", sha[:7]))
    page.locator("tbody tr", has_text=sha[:7]).get_by_role("link").click()
    diff = page.locator("pre.diff")
    pair = support.evidence["pair"]
    walk.arrived(
        "regression-support",
        text(
            sha[:12],
            "Prompt changed",
            "Before and after",
            pair["before"]["request_id"],
            pair["after"]["request_id"],
        ),
    )
    expect(diff).to_contain_text("Current time")  # the commit's diff: the time moved to the top
    expect(page.locator("main")).not_to_contain_text("None found yet")  # its killers were frozen
    expect(page.locator("table.killers a[href^='/requests/']").first).to_be_visible()  # their samples

    page.get_by_role("link", name="Compare the two token by token").click()
    walk.arrived("compare-pair", text("first divergence at token"))
    walk.open("/compare/", "compare", text("Compare two prompts"))

    walk.open(reverse("dashboard:templates"), "templates", text("support", "billing", "agent"))
    page.get_by_role("link", name="support", exact=True).click()
    walk.arrived("template-support", text(support.get_kind_display()))
    listed = page.locator(
        "tr", has=page.locator(f'a[href="{reverse("regressions:detail", args=[support.pk])}"]')
    )
    expect(listed).to_contain_text(sha[:7])  # the regression, with its suspect commit
    marker = page.locator(f'#chart-hit-rate a.chart-marker[data-version="{support.suspect_version.pk}"]')
    marker.click()
    expect(page.locator("#version-panel")).to_contain_text(sha[:7])
    expect(page.locator("#version-panel pre.diff")).to_contain_text("Current time")
    page.locator("#version-panel").screenshot(path=str(SCREENSHOTS / f"walk-template-version-{scheme}.png"))

    record = RequestRecord.objects.filter(template__name="support").order_by("-arrived_at").first()
    assert record is not None
    walk.open(reverse("dashboard:requests"), "requests", text(record.request_id[:12]))
    server = Server.objects.get(pk=record.server_id)
    detail = reverse("dashboard:request-detail", args=[server.name, record.request_id])
    walk.open(detail, "request", text(f"Request {record.request_id}", "Funnel"))
    walk.open(reverse("dashboard:server-detail", args=[server.name]), "server", text("Block residency"))
    walk.open(reverse("dashboard:collection"), "collection", text("KV event gaps"))
    walk.open(
        reverse("dashboard:tenants") + "?window=6h",
        "tenants",
        text("acme", "globex", "Hit rate", "Prefixes shared across tenants with no salt"),
    )
    expect(page.get_by_label("6h")).to_be_checked()  # the window from its URL
    walk.open(reverse("prompts:families"), "families", text("Prefix families"))
    walk.open(reverse("setup:servers"), "setup-servers", text(*(s.name for s in run.servers)))
    walk.open(reverse("setup:server", args=[server.pk]), "setup-server", text(server.name))
    walk.open(reverse("setup:ingest-tokens"), "setup-ingest-tokens", text("Ingest tokens"))
    walk.open(reverse("prompts:repositories"), "setup-repositories", text("templates"))
    walk.open(reverse("setup:personal-tokens"), "setup-tokens", text("Your API tokens"))
    walk.open(reverse("runbooks"), "runbooks", text("Runbooks"))
    walk.open(reverse("runbook", args=["regression-open"]), "runbook", text("What to do"))

    assert nav - {reverse("admin:index")} <= walk.visited, nav - walk.visited  # every page of the nav
    assert walk.errors == [] and blocked == []
