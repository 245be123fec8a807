import csv
import io
import re
from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from app.dashboard.reads.fleet import fleet_headline
from app.domain.misses import GATEWAY_CACHE, OF_COUNTERS, OF_HOSTED, OF_RECORDED, OF_REUSABLE
from app.fleet.models import Server
from app.regressions.models import Regression
from app.rollups.refresh import refresh_loss_minutes, refresh_minute_rollups
from app.rollups.servers import refresh_server_minutes
from app.traffic.models import (
    KVGap,
    KVStream,
    MetricSeries,
    MinuteRollup,
    RequestDiagnosis,
    RequestRecord,
    ScrapeSample,
    ServerHour,
    ServerMinute,
)
from tests.support.factories import a_server
from tests.support.server_traffic import a_served_server
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


def test_the_fleet_page_asks_for_a_login(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_fleet_page_shows_each_servers_hit_rate_over_the_last_hour(signed_in: Client) -> None:
    busy = Server.objects.create(
        name="vllm-busy", base_url="http://a:8000", block_size=32, hash_algo="sha256_cbor"
    )
    a_server(name="vllm-idle")
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=3)
    for offset, (prompt, cached) in enumerate([(400, 320), (600, 0)]):
        MinuteRollup.objects.create(
            server=busy,
            minute=minute - timedelta(minutes=offset),
            requests=2,
            prompt_tokens=prompt + 500,
            cache_known_prompt_tokens=prompt,
            cached_tokens=cached,
        )
    MinuteRollup.objects.create(  # older than the window: not counted
        server=busy,
        minute=minute - timedelta(hours=2),
        requests=50,
        prompt_tokens=1000,
        cache_known_prompt_tokens=1000,
        cached_tokens=1000,
    )
    # Their sums per server, as the service that writes minutes keeps them (no records: minutes unchanged).
    refresh_minute_rollups(since=minute - timedelta(hours=3), until=timezone.now())

    html = signed_in.get("/").content.decode()

    busy_row = html[html.index("vllm-busy") : html.index("</tr>", html.index("vllm-busy"))]
    assert "32.0 %" in busy_row  # 320 cached of the 1,000 prompt tokens whose cached tokens are known
    assert ">4<" in busy_row  # requests in the hour
    idle_row = html[html.index("vllm-idle") : html.index("</tr>", html.index("vllm-idle"))]
    assert "—" in idle_row


def test_an_htmx_poll_gets_only_the_table(signed_in: Client) -> None:
    a_server(name="vllm-0")
    response = signed_in.get("/", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="fleet-table"')
    assert "<html" not in html


def test_the_counter_hit_rate_comes_from_scraped_counters_across_a_restart(signed_in: Client) -> None:
    server = a_server(name="vllm-counted")
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
    client.force_login(fleet_viewer("operator", is_staff=True))
    return client


def section(html: str, dom_id: str) -> str:
    start = html.index(f'<section id="{dom_id}"')
    return html[start : html.index("</section>", start)]


def row_of(html: str, name: str) -> str:
    start = html.index(f">{name}<")
    return html[start : html.index("</tr>", start)]


def test_proposed_servers_are_listed_last_and_decided_apart(signed_in: Client) -> None:
    a_server(name="vllm-0")
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
    real = a_server(name="vllm-0")
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
    no_token.force_login(fleet_viewer("operator", is_staff=True))
    assert no_token.post(f"/proposed/{typo.pk}/", accept).status_code == 403
    typo.refresh_from_db()
    assert typo.state == Server.State.PROPOSED


def _rate(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def test_the_headline_equals_the_stored_rows_summed_apart_over_now_an_hour_and_a_day() -> None:
    """Minute rows over a day (so the day is read from hours, and minutes at its edges): each
    period's figures equal those rows summed here, in Python."""
    servers = [a_server(name=f"vllm-{i}") for i in range(2)]
    now = timezone.now()
    minute = now.replace(second=0, microsecond=0)
    for i, server in enumerate(servers):
        for ago in (0, 2, 7, 45, 59, 61, 150, 600, 1300, 1439, 1441):  # minutes before this one
            at = minute - timedelta(minutes=ago)
            MinuteRollup.objects.create(
                server=server,
                minute=at,
                requests=1,
                prompt_tokens=1000,
                cache_known_prompt_tokens=800 + ago % 7,
                cached_tokens=100 * i + ago % 500,
            )
            ServerMinute.objects.create(
                server=server,
                minute=at,
                scrapes=4,
                prefix_queries=900 + ago,
                prefix_hits=(300 + 7 * ago) % 900,
            )
    oldest = minute - timedelta(days=2)
    refresh_minute_rollups(since=oldest, until=now)  # the hours, from these minutes
    refresh_server_minutes(since=oldest, until=now)

    head = fleet_headline(servers=Server.objects.all(), now=now, since=now - timedelta(hours=1), until=now)

    for rates, since in [(head.now, minute - timedelta(minutes=4)), (head.hour, now - timedelta(hours=1)),
                         (head.day, now - timedelta(days=1))]:  # fmt: skip
        inside = MinuteRollup.objects.filter(minute__gte=since, minute__lt=now)
        cached = sum(r.cached_tokens for r in inside)
        assert rates.requests == pytest.approx(
            _rate(cached, sum(r.cache_known_prompt_tokens for r in inside))
        )
        scraped = ServerMinute.objects.filter(minute__gte=since, minute__lt=now)
        hits, queries = sum(r.prefix_hits for r in scraped), sum(r.prefix_queries for r in scraped)
        assert rates.counters == pytest.approx(_rate(hits, queries))
    hour = MinuteRollup.objects.filter(minute__gte=now - timedelta(hours=1), minute__lt=now)
    assert head.saved_tokens == sum(r.cached_tokens for r in hour)
    assert head.day != head.hour  # the periods differ, so the test tells them apart


def test_lost_tokens_by_cause_are_the_diagnoses_summed_and_open_regressions_are_counted(
    signed_in: Client,
) -> None:
    server = a_server(name="vllm-lossy")
    now = timezone.now()
    lost = [("evicted_tokens", 320), ("routed_elsewhere_tokens", 64), ("evicted_tokens", 96)]
    for i, (column, tokens) in enumerate(lost):
        arrived_at = now - timedelta(minutes=10 + i)
        RequestDiagnosis.objects.create(
            server=server,
            request_id=f"r{i}",
            arrived_at=arrived_at,
            diagnosed_at=now,
            prompt_tokens=1000,
            **{column: tokens},
        )
    refresh_loss_minutes(since=now - timedelta(minutes=20), until=now)
    for i, state in enumerate(("open", "open", "acknowledged", "resolved")):
        Regression.objects.create(
            scope="server",
            server=server,
            changed_at=now - timedelta(minutes=i),
            detected_at=now,
            updated_at=now,
            rate_before=0.8,
            rate_after=0.3,
            rate_now=0.3,
            requests_before=100,
            requests_after=50,
            confidence=0.99,
            state=state,
        )

    head = fleet_headline(servers=Server.objects.all(), now=now, since=now - timedelta(hours=1), until=now)
    html = signed_in.get("/").content.decode()

    assert head.lost_tokens == {"evicted": 416, "routed_elsewhere": 64} and head.lost_total == 480
    assert (head.open_regressions, head.acknowledged_regressions) == (2, 1)
    assert '<a href="/regressions/?state=open">2 open</a>' in html
    assert '<td>Evicted</td><td class="num">416</td>' in html


@pytest.mark.parametrize(
    ("state", "pulled_ago", "shown"),
    [
        (Server.State.ACTIVE, timedelta(seconds=20), "up"),
        (Server.State.ACTIVE, timedelta(minutes=5), "stale"),  # three 15 s pulls missed: no pulls happen
        (Server.State.ACTIVE, None, "stale"),  # registered and never pulled
        (Server.State.DOWN, timedelta(seconds=20), "down"),  # its last pull failed
        (Server.State.DISABLED, None, "disabled"),
    ],
)
def test_a_servers_state_says_whether_its_pulls_are_recent_and_answered(
    signed_in: Client, state: str, pulled_ago: timedelta | None, shown: str
) -> None:
    last = None if pulled_ago is None else timezone.now() - pulled_ago
    a_server(name="vllm-s", state=state, last_scraped_at=last)

    row = row_of(section(signed_in.get("/").content.decode(), "fleet-table"), "vllm-s")

    assert f'<span class="state state-{shown}">{shown}</span>' in row


def test_the_kv_event_stream_shows_its_last_event_and_the_batches_its_gaps_lost(signed_in: Client) -> None:
    server = Server.objects.create(
        name="vllm-kv", base_url="http://k:8000", kv_events_endpoint="tcp://k:5557"
    )
    a_server(name="vllm-quiet")
    now = timezone.now()
    KVStream.objects.create(server=server, dp_rank=0, last_seq=90, last_event_at=now - timedelta(seconds=42))
    for first, lost in [(10, 3), (50, 0)]:
        KVGap.objects.create(
            server=server,
            epoch=0,
            first_seq=first,
            last_seq=first + 4,
            recovered=5 - lost,
            lost=lost,
            detected_at=now - timedelta(minutes=5),
        )
    KVGap.objects.create(
        server=server,
        epoch=0,
        first_seq=1,
        last_seq=2,
        recovered=0,
        lost=2,
        detected_at=now - timedelta(hours=3),
    )  # before the window: not counted

    table = section(signed_in.get("/").content.decode(), "fleet-table")

    assert "last event 42 s ago" in row_of(table, "vllm-kv") or "last event 43 s ago" in row_of(
        table, "vllm-kv"
    )
    assert "2 gaps, 3 lost" in row_of(table, "vllm-kv")
    assert "not subscribed" in row_of(table, "vllm-quiet")


def test_the_sparklines_numbers_are_each_servers_counters_per_bucket_in_the_table_and_csv(
    signed_in: Client,
) -> None:
    server, start = a_served_server()
    refresh_server_minutes(since=start - timedelta(minutes=5), until=timezone.now())

    partial = signed_in.get("/?window=1h", headers={"HX-Request": "true"}).content.decode()
    csv_text = signed_in.get("/?window=1h&format=csv").content.decode()

    assert f'id="spark-{server.pk}-data"' in partial and 'hx-get="/?window=1h"' in partial
    rows = list(csv.reader(io.StringIO(csv_text)))
    assert rows[0] == ["time", "vllm-charted"] and len(rows) - 1 in (60, 61)  # the minute begun too
    by_minute = {datetime.fromisoformat(at): float(v) for at, v in rows[1:] if v}
    expected = {r.minute: r.prefix_hits / r.prefix_queries for r in ServerMinute.objects.filter(server=server)
                if r.prefix_queries and r.minute >= datetime.fromisoformat(rows[1][0])}  # fmt: skip
    assert by_minute == pytest.approx(expected) and len(expected) >= 10
    assert all(v == pytest.approx(0.4) for v in by_minute.values())  # 40 of every 100 queried tokens hit
    first = min(by_minute)
    numbers = signed_in.get("/?window=1h&numbers=1").content.decode()  # fetched as its table opens
    assert f'<td>{first:%Y-%m-%d %H:%M}</td><td class="num">40.0 %</td>' in numbers
    assert 'hx-get="?window=1h&amp;numbers=1"' in partial and "hx-preserve" in partial


def test_a_long_window_is_chosen_in_the_url_and_read_from_the_hours(signed_in: Client) -> None:
    server, start = a_served_server()
    refresh_server_minutes(since=start - timedelta(minutes=5), until=timezone.now())

    html = signed_in.get("/?window=7d").content.decode()

    assert 'value="7d" checked' in html and f'href="/servers/{server.pk}/?window=7d"' in html
    rows = list(csv.reader(io.StringIO(signed_in.get("/?window=7d&format=csv").content.decode())))
    assert len(rows) - 1 in (7 * 24, 7 * 24 + 1)  # hourly buckets, the hour begun too
    hour = start.replace(minute=0)
    assert [float(v) for at, v in rows[1:] if v] == pytest.approx(
        [r.prefix_hits / r.prefix_queries for r in ServerHour.objects.filter(server=server).order_by("hour")]
    ) and any(datetime.fromisoformat(at) == hour for at, v in rows[1:] if v)


def test_semantic_cache_answers_are_counted_apart_and_every_rate_says_its_definition(
    signed_in: Client,
) -> None:
    server = a_server(name="vllm-cached")
    now = timezone.now()
    for i, unknown in enumerate([RequestDiagnosis.Unknown.GATEWAY_CACHE] * 2 + [""]):
        RequestDiagnosis.objects.create(
            server=server, request_id=f"g{i}", arrived_at=now - timedelta(minutes=5 + i), diagnosed_at=now,
            prompt_tokens=0 if unknown else 500, unknown=unknown,
        )  # fmt: skip
    refresh_loss_minutes(since=now - timedelta(minutes=20), until=now)

    head = fleet_headline(servers=Server.objects.all(), now=now, since=now - timedelta(hours=1), until=now)
    html = signed_in.get("/").content.decode()

    assert head.gateway_cache_answers == 2
    card = html[html.index('id="gateway-cache"') :]
    assert '<p class="figure">2</p>' in card[: card.index("</div>")]
    assert GATEWAY_CACHE in card
    definitions = re.findall(r'class="muted small hit-rate-definition">(.*?)</p>', html, re.S)
    assert len(definitions) == 5  # now, last hour, last day, reusable, hosted
    assert all(escape(OF_RECORDED) in text for text in definitions[:3])
    assert escape(OF_REUSABLE) in definitions[3] and "hosted-API ones included" in definitions[3]
    assert escape(OF_HOSTED) in definitions[4]
    assert escape(OF_COUNTERS) in html[html.index('<table class="fleet">') :]
