"""The set-up pages in Debian's chromium, as a new user walks them: a server registered, a proposed one
accepted, one disabled and edited; an ingest token created, used and revoked; a repository's import
followed while it runs; a personal token made. Light and dark (screenshots in SCREENSHOTS, to look at)."""

import pytest
from django.test import Client
from playwright.sync_api import Browser, Page, expect
from pytest_django.live_server_helper import LiveServer

from app.fleet.models import Server
from app.prompts.models import TemplateRepository
from tests.core.test_pages_browser import CHROMIUM, SCREENSHOTS, Scheme, browser, luminance, offline_page
from tests.setup.test_pages import ingest

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]
__all__ = ["browser"]  # the fixture, shared with the other browser tests


def shot(page: Page, name: str, scheme: Scheme) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"setup-{name}-{scheme}.png"), full_page=True)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_new_user_sets_up_the_fleet_without_the_admin(
    browser: Browser, live_server: LiveServer, scheme: Scheme
) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    Server.objects.create(name="vllm-gw-7", state=Server.State.PROPOSED)
    page, blocked = offline_page(browser, live_server, scheme=scheme, user="operator")
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("dialog", lambda dialog: dialog.accept())

    page.goto(f"{live_server.url}/")
    page.get_by_role("link", name="Set-up").click()
    page.get_by_label("Name", exact=True).fill("vllm-0")
    page.get_by_label("Base URL", exact=True).fill("http://127.0.0.1:18000")
    page.get_by_label("KV events").fill("tcp://127.0.0.1:5557")
    page.get_by_role("button", name="Register").click()
    expect(page.locator("ul.messages")).to_contain_text("vllm-0 is registered")

    shot(page, "servers-proposed", scheme)
    proposed = page.locator("tr", has_text="vllm-gw-7")
    proposed.get_by_label("Base URL of vllm-gw-7").fill("http://127.0.0.1:18001")
    proposed.get_by_role("button", name="Accept").click()  # htmx: the list is swapped in place
    expect(page.locator("#server-list ul.messages")).to_contain_text("vllm-gw-7 is registered")
    page.locator("tr", has_text="vllm-gw-7").get_by_role("button", name="Disable").click()
    expect(page.locator("tr", has_text="vllm-gw-7")).to_contain_text("Disabled")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    field = page.get_by_label("Base URL", exact=True).evaluate("e => getComputedStyle(e).backgroundColor")
    if scheme == "dark":
        assert luminance(background) < 0.2 and luminance(field) < 0.2  # form controls dark too
    shot(page, "servers", scheme)

    page.get_by_role("link", name="vllm-0").click()
    page.get_by_label("Pull every (seconds)").fill("30")
    shot(page, "server-edit", scheme)
    page.get_by_role("button", name="Save").click()
    expect(page.locator("ul.messages")).to_contain_text("vllm-0: saved")
    assert Server.objects.get(name="vllm-0").scrape_interval_seconds == 30
    assert Server.objects.get(name="vllm-gw-7").state == Server.State.DISABLED

    page.get_by_role("link", name="Ingest tokens").click()
    page.get_by_label("Name").fill("gateway-eu-1")
    page.get_by_role("button", name="Create").click()
    secret = page.get_by_label("Secret").input_value()
    assert secret.startswith("psi_")
    shot(page, "ingest-token-created", scheme)
    assert ingest(secret) == 200
    page.reload()  # a GET: the secret is gone for good
    expect(page.locator("#created-secret")).to_have_count(0)
    page.locator("tr", has_text="gateway-eu-1").get_by_role("button", name="Revoke").click()
    expect(page.locator("tr", has_text="gateway-eu-1")).to_contain_text("Revoked")
    assert ingest(secret) == 401
    shot(page, "ingest-tokens", scheme)

    repository = TemplateRepository.objects.create(
        name="prompts",
        location="https://git.example.com/prompts.git",
        globs=["templates/*.j2"],
        state=TemplateRepository.State.RUNNING,
        commits_imported=3,
        commits_total=12,
    )
    page.get_by_role("link", name="Template repositories").click()
    expect(page.locator("#repository-list progress")).to_have_attribute("value", "25")
    shot(page, "repositories-importing", scheme)
    TemplateRepository.objects.filter(pk=repository.pk).update(
        state=TemplateRepository.State.IDLE, commits_imported=12, last_imported_sha="a" * 40
    )
    # htmx polls the list while an import runs: the page follows it without a reload.
    expect(page.locator(f"#repository-{repository.pk}")).to_contain_text("Idle", timeout=10_000)
    expect(page.locator("#repository-list[hx-trigger]")).to_have_count(0)  # and stops once it is done
    page.locator(f"#repository-{repository.pk}").get_by_role("link", name="Edit").click()
    page.get_by_label("Branch").fill("release")
    shot(page, "repository-edit", scheme)
    page.get_by_role("button", name="Save").click()
    expect(page.locator("ul.messages")).to_contain_text("prompts: saved")

    page.goto(f"{live_server.url}/setup/tokens/")
    page.get_by_label("Name").fill("grafana")
    page.get_by_role("button", name="Create").click()
    personal = page.get_by_label("Secret").input_value()
    assert Client(headers={"Authorization": f"Bearer {personal}"}).get("/api/v1/templates").status_code == 200
    shot(page, "personal-tokens", scheme)
    page.locator("tr", has_text="grafana").get_by_role("button", name="Revoke").click()
    expect(page.locator("tr", has_text="grafana")).to_contain_text("Revoked")
    assert errors == [] and blocked == []
