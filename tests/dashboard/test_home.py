from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from app.fleet.models import Server
from app.traffic.models import MetricSeries, MinuteRollup, RequestRecord, ScrapeSample
from app.traffic.services.server_rollups import refresh_server_minutes

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(User.objects.create_user("engineer"))
    return client


def test_the_fleet_page_asks_for_a_login(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_fleet_page_shows_each_servers_hit_rate_over_the_last_hour(signed_in: Client) -> None:
    busy = Server.objects.create(
        name="vllm-busy", base_url="http://a:8000", block_size=32, hash_algo="sha256_cbor"
    )
    Server.objects.create(name="vllm-idle", base_url="http://b:8000")
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=3)
    for offset, (prompt, cached) in enumerate([(400, 320), (600, 0)]):
        MinuteRollup.objects.create(
            server=busy, minute=minute - timedelta(minutes=offset), requests=2, prompt_tokens=prompt + 500,
            cache_known_prompt_tokens=prompt, cached_tokens=cached,
        )  # fmt: skip
    MinuteRollup.objects.create(  # older than the window: not counted
        server=busy, minute=minute - timedelta(hours=2), requests=50, prompt_tokens=1000,
        cache_known_prompt_tokens=1000, cached_tokens=1000,
    )  # fmt: skip

    html = signed_in.get("/").content.decode()

    busy_row = html[html.index("vllm-busy") : html.index("</tr>", html.index("vllm-busy"))]
    assert "32.0 %" in busy_row  # 320 cached of the 1,000 prompt tokens whose cached tokens are known
    assert ">4<" in busy_row  # requests in the hour
    idle_row = html[html.index("vllm-idle") : html.index("</tr>", html.index("vllm-idle"))]
    assert "—" in idle_row


def test_an_htmx_poll_gets_only_the_table(signed_in: Client) -> None:
    Server.objects.create(name="vllm-0", base_url="http://a:8000")
    response = signed_in.get("/", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="fleet-table"')
    assert "<html" not in html


def test_the_counter_hit_rate_comes_from_scraped_counters_across_a_restart(signed_in: Client) -> None:
    server = Server.objects.create(name="vllm-counted", base_url="http://c:8000")
    hits = MetricSeries.objects.create(
        server=server, name="vllm:prefix_cache_hits_total", labels={}, kind="counter"
    )
    queries = MetricSeries.objects.create(
        server=server, name="vllm:prefix_cache_queries_total", labels={}, kind="counter"
    )
    start = timezone.now() - timedelta(minutes=30)
    # queries 0 -> 1000, restart, 0 -> 600: 1,600 queried; hits 0 -> 400, restart, 0 -> 240: 640 hit.
    for minute, (q, h) in enumerate([(0, 0), (1000, 400), (200, 80), (600, 240)]):
        at = start + timedelta(minutes=minute)
        ScrapeSample.objects.create(server=server, series=queries, scraped_at=at, value=q)
        ScrapeSample.objects.create(server=server, series=hits, scraped_at=at, value=h)

    refresh_server_minutes(since=start, until=timezone.now())  # as the rollup task does every minute

    html = signed_in.get("/").content.decode()

    row = html[html.index("vllm-counted") : html.index("</tr>", html.index("vllm-counted"))]
    assert "40.0 %" in row  # 640 / 1,600


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_user("operator", is_staff=True))
    return client


def section(html: str, dom_id: str) -> str:
    start = html.index(f'<section id="{dom_id}"')
    return html[start : html.index("</section>", start)]


def row_of(html: str, name: str) -> str:
    start = html.index(f">{name}<")
    return html[start : html.index("</tr>", start)]


def test_proposed_servers_are_listed_last_and_decided_apart(signed_in: Client) -> None:
    Server.objects.create(name="vllm-0", base_url="http://a:8000")
    Server.objects.create(name="vllm-0-typo", base_url="", state=Server.State.PROPOSED)

    html = signed_in.get("/").content.decode()

    table = section(html, "fleet-table")
    assert table.index("vllm-0<") < table.index("vllm-0-typo")
    assert "state-proposed" in row_of(table, "vllm-0-typo") and "<form" not in table
    proposed = section(html, "proposed-servers")
    assert "vllm-0-typo" in proposed and "Proposed servers" in proposed
    assert "<form" not in proposed  # deciding is for staff


def test_staff_accept_a_proposed_server_and_it_joins_the_fleet(staff: Client) -> None:
    typo = Server.objects.create(name="vllm-9", base_url="", state=Server.State.PROPOSED)
    page = staff.get("/").content.decode()
    assert f'action="/proposed/{typo.pk}/"' in section(page, "proposed-servers")

    response = staff.post(f"/proposed/{typo.pk}/", {"action": "accept", "base_url": "http://vllm-9:8000"})

    assert response.status_code == 302 and response["Location"] == "/"
    html = staff.get("/").content.decode()
    assert "vllm-9" in section(html, "fleet-table")
    assert "vllm-9 is registered" in section(html, "proposed-servers")
    typo.refresh_from_db()
    assert (typo.state, typo.base_url) == (Server.State.ACTIVE, "http://vllm-9:8000")


def test_an_htmx_merge_answers_with_the_proposed_list_and_refreshes_the_fleet_table(staff: Client) -> None:
    real = Server.objects.create(name="vllm-0", base_url="http://a:8000")
    typo = Server.objects.create(name="vllm-0-typo", base_url="", state=Server.State.PROPOSED)
    RequestRecord.objects.create(server=typo, request_id="r1", arrived_at=timezone.now(), source="otlp")

    response = staff.post(
        f"/proposed/{typo.pk}/", {"action": "merge", "into": real.pk}, headers={"HX-Request": "true"}
    )

    html = response.content.decode()
    assert html.lstrip().startswith('<section id="proposed-servers"') and "<html" not in html
    assert "Merged into vllm-0: 1 request records moved, 0 joined" in html
    assert response["HX-Trigger"] == "fleet-changed"
    assert 'hx-trigger="every 30s, fleet-changed from:body"' in staff.get("/").content.decode()
    assert RequestRecord.objects.get().server_id == real.pk
    assert not Server.objects.filter(pk=typo.pk).exists()


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"action": "accept", "base_url": ""}, "Accepting needs the server&#x27;s base URL"),
        ({"action": "accept", "base_url": "vllm-0:8000"}, "Enter an http:// or https:// URL with a host"),
        ({"action": "merge"}, "Choose the registered server to merge into."),
    ],
)
def test_an_incomplete_decision_shows_its_error_and_changes_nothing(
    staff: Client, data: dict[str, str], error: str
) -> None:
    typo = Server.objects.create(name="vllm-0-typo", base_url="", state=Server.State.PROPOSED)
    for headers in ({}, {"HX-Request": "true"}):
        response = staff.post(f"/proposed/{typo.pk}/", data, headers=headers)
        assert response.status_code == 200
        assert error in section(response.content.decode(), "proposed-servers")
    typo.refresh_from_db()
    assert typo.state == Server.State.PROPOSED


def test_only_staff_decide_and_only_with_a_csrf_token(signed_in: Client) -> None:
    typo = Server.objects.create(name="vllm-0-typo", base_url="", state=Server.State.PROPOSED)
    accept = {"action": "accept", "base_url": "http://a:8000"}
    assert signed_in.post(f"/proposed/{typo.pk}/", accept).status_code == 403
    assert signed_in.get(f"/proposed/{typo.pk}/").status_code == 405
    no_token = Client(enforce_csrf_checks=True)
    no_token.force_login(User.objects.create_user("operator", is_staff=True))
    assert no_token.post(f"/proposed/{typo.pk}/", accept).status_code == 403
    typo.refresh_from_db()
    assert typo.state == Server.State.PROPOSED
