"""A server's page: its charts' numbers (as a table and as CSV) from its pulls, requests and KV events,
the window in the URL, residency, and the Fleet table's link to it."""

import csv
import io
import itertools
import re
from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from app.fleet.models import Server
from app.rollups.servers import refresh_server_minutes
from app.traffic.models import ResidentBlock
from app.traffic.services.kv_events import StreamPosition, store_kv_events
from app.traffic.services.scrapes import record_scrape
from collectors.metrics.parse import parse_metrics
from tests.support.captures import VLLM_CPU_FIXTURES
from tests.support.server_traffic import a_served_server
from tests.support.users import fleet_viewer
from tests.traffic.test_kv_storage import captured_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


def chart_csv(client: Client, path: str, chart: str, **params: str) -> dict[datetime, list[str]]:
    response = client.get(path, {**params, "chart": chart, "format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    return {datetime.fromisoformat(row[0]): row[1:] for row in rows[1:]} | {datetime.min: rows[0]}


def test_the_page_asks_for_a_login(client: Client) -> None:
    server, _ = a_served_server()
    assert client.get(f"/servers/{server.pk}/").status_code == 302


def test_the_hit_rate_chart_holds_the_requests_and_the_counters_rates(signed_in: Client) -> None:
    server, start = a_served_server()
    found = chart_csv(signed_in, f"/servers/{server.name}/", "hit-rate")
    assert found[datetime.min] == ["time", "hit_rate", "engine_hit_rate"]
    for minute in range(10):
        requests_rate, counters_rate = found[start + timedelta(minutes=minute)]
        assert float(requests_rate) == 100 * minute / 1000  # minute m: 100 m of 1,000 cached
        assert float(counters_rate) == 0.4  # 40 hits per 100 queried, each pull


def test_request_rate_kv_usage_and_preemptions_come_from_the_pulls(signed_in: Client) -> None:
    server, start = a_served_server()
    path = f"/servers/{server.pk}/"
    minute = start + timedelta(minutes=3)
    rate = chart_csv(signed_in, path, "request-rate")
    assert [float(v) for v in rate[minute]] == [0.2, 1 / 60]  # 12 finished a minute; 1 recorded
    assert float(chart_csv(signed_in, path, "kv-usage")[minute][0]) == pytest.approx(0.3)
    evictions = chart_csv(signed_in, path, "evictions")
    assert evictions[datetime.min] == ["time", "evictions", "preemptions"]
    assert [float(v) for v in evictions[start]] == [1.0, 1.0]  # a block removed 30 s in; a pull's odd count
    assert float(evictions[start + timedelta(minutes=1)][0]) == 1.0  # the other, 90 s in


def test_the_table_under_a_chart_shows_the_numbers_of_its_csv(signed_in: Client) -> None:
    server, start = a_served_server()
    html = signed_in.get(f"/servers/{server.pk}/").content.decode()
    assert html.count('<figure class="chart"') == 6
    row = html[html.index(f"{start + timedelta(minutes=3):%Y-%m-%d %H:%M}</td>") :]
    assert row.index("30.0 %") < row.index("40.0 %") < row.index("</tr>")  # requests, counters
    assert 'id="hit-rate-data" type="application/json"' in html


def test_residency_lifetimes_come_from_the_kv_events(signed_in: Client) -> None:
    server, _ = a_served_server()
    html = signed_in.get(f"/servers/{server.pk}/").content.decode()
    row = html[html.index("stayed resident (stored to removed)") :]
    row = row[: row.index("</tr>")]
    assert ">2<" in row and "60.0 s" in row  # two blocks, 30 and 90 s: the median 60 s
    assert "not exposed" in html  # vLLM's block histograms: no --kv-cache-metrics on this server


@pytest.mark.parametrize(
    ("params", "bucket", "minutes"),
    [({}, 60, 60), ({"window": "6h"}, 300, 360), ({"window": "7d"}, 3600, 7 * 24 * 60)],
)
def test_the_window_in_the_url_picks_the_span_and_its_bucket(
    signed_in: Client, params: dict[str, str], bucket: int, minutes: int
) -> None:
    server, _ = a_served_server()
    found = chart_csv(signed_in, f"/servers/{server.pk}/", "ttft", **params)
    times = sorted(t for t in found if t != datetime.min)
    assert len(times) in (minutes * 60 // bucket, minutes * 60 // bucket + 1)
    assert all((b - a).total_seconds() == bucket for a, b in itertools.pairwise(times))


def test_a_custom_window_is_kept_in_the_url_and_a_bad_one_falls_back_to_the_last_hour(
    signed_in: Client,
) -> None:
    server, start = a_served_server()
    custom = {
        "window": "custom",
        "since": f"{start:%Y-%m-%dT%H:%M}",
        "until": f"{start + timedelta(minutes=10):%Y-%m-%dT%H:%M}",
    }
    html = signed_in.get(f"/servers/{server.pk}/", custom).content.decode()
    assert f'value="{start:%Y-%m-%dT%H:%M}"' in html and "window=custom" in html
    assert (
        len(
            [
                t
                for t in chart_csv(signed_in, f"/servers/{server.pk}/", "hit-rate", **custom)
                if t != datetime.min
            ]
        )
        == 10
    )
    bad = signed_in.get(f"/servers/{server.pk}/", {"window": "custom", "since": "soon"}).content.decode()
    assert "Custom window not drawn" in bad


def test_the_fleet_table_links_each_server_to_its_page(signed_in: Client) -> None:
    server, _ = a_served_server()
    assert f'href="/servers/{server.pk}/"' in signed_in.get("/").content.decode()


def test_an_unknown_server_or_chart_is_a_404(signed_in: Client) -> None:
    server, _ = a_served_server()
    assert signed_in.get("/servers/nobody/").status_code == 404
    assert signed_in.get("/servers/99999999999999999999/").status_code == 404  # beyond a bigint: a name
    assert signed_in.get("/servers/a%00b/").status_code == 404
    assert signed_in.get(f"/servers/{server.pk}/", {"chart": "nope", "format": "csv"}).status_code == 404


def test_the_real_server_after_its_traffic_reads_0_usage_with_its_prefix_cache_full(
    signed_in: Client,
) -> None:
    """The capture: vllm:kv_cache_usage_perc 0.0 after the traffic (cached blocks no request holds are
    free to vLLM) while its KV events left blocks resident. Both pages say both, the resident blocks as
    a share of the server's usable KV blocks (cache_config_info's 48, less vLLM's null block)."""
    server = Server.objects.create(
        name="vllm-cpu", base_url="http://127.0.0.1:9", kv_events_endpoint="tcp://x:1"
    )
    now = timezone.now()
    page = (VLLM_CPU_FIXTURES / "metrics-after.txt").read_text(encoding="utf-8")
    for seconds in (120, 60):
        record_scrape(
            server=server,
            scraped_at=now - timedelta(seconds=seconds),
            samples=parse_metrics(page),
            duration_seconds=0.01,
        )
    rows = captured_rows(server, emitted_at=now - timedelta(minutes=2))
    store_kv_events(rows=rows, positions=[StreamPosition(server.pk, 0, 0, 23, rows[-1].emitted_at)])
    refresh_server_minutes(since=now - timedelta(minutes=5), until=now)
    resident = ResidentBlock.objects.filter(server=server).count()
    server.refresh_from_db()
    assert server.num_gpu_blocks == 48 and 0 < resident <= 47

    fleet = signed_in.get("/").content.decode()
    detail = signed_in.get(f"/servers/{server.pk}/").content.decode()

    cell = re.search(r'<td class="num kv">(.*?)</td>', fleet, re.S)
    assert cell is not None
    shown = re.sub(r"<[^>]+>", "", cell.group(1))
    assert "0 % in use" in shown  # the capture's gauge, as vLLM read it
    assert f"{100 * resident / 47:.0f} % cached" in shown
    assert f"{resident} blocks resident</strong> of 47 ({100 * resident / 47:.1f} %)" in detail
    minute = now.replace(second=0, microsecond=0) - timedelta(minutes=1)
    assert chart_csv(signed_in, f"/servers/{server.pk}/", "kv-usage")[minute] == ["0.0"]


def test_a_hybrid_servers_page_states_its_effective_block_and_a_plain_ones_does_not(
    signed_in: Client,
) -> None:
    server, _ = a_served_server()
    assert 'id="effective-block"' not in signed_in.get(f"/servers/{server.pk}/").content.decode()
    Server.objects.filter(pk=server.pk).update(block_size=16, stated_hit_block=3584)
    page = signed_in.get(f"/servers/{server.pk}/").content.decode()
    assert "Effective block 3,584 tokens: prompts below 3,585 tokens never hit." in page


def test_hits_by_storage_tier_come_from_the_offloading_counters(signed_in: Client) -> None:
    server = Server.objects.create(name="offloading", base_url="http://127.0.0.1:1")
    now = timezone.now()
    pull = 'vllm:kv_offload_tiering_chunk_{}_total{{engine="0",tier="0:primary"}} {}\n'
    for minutes, (queries, hits) in enumerate([(10, 5), (50, 25)]):
        text = pull.format("queries", queries) + pull.format("hits", hits)
        record_scrape(server=server, scraped_at=now - timedelta(minutes=10 - minutes),
                      samples=parse_metrics(text), duration_seconds=0.1)  # fmt: skip
    html = signed_in.get(f"/servers/{server.pk}/").content.decode()
    row = html[html.index('id="tier-hits"') :]
    row = row[row.index("<tbody>") :]
    row = row[: row.index("</tr>")]
    assert "cpu" in row and "20 blocks" in row and ">40<" in row and "50 %" in row
    other = Server.objects.create(name="plain", base_url="http://127.0.0.1:2")
    assert "No lower tier reported" in signed_in.get(f"/servers/{other.pk}/").content.decode()
