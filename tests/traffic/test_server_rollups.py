"""The servers' minute and hour rollups equal what their raw pulls and KV events say, summed apart."""

from collections import defaultdict
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.fleet.models import Server
from app.rollups.series import SERVER_METRICS, parse_query, raw_server_series, series
from app.rollups.servers import SCRAPE_GAP, refresh_server_minutes
from app.traffic.models import KVEvent, MetricSeries, Scrape, ScrapeSample, ServerHour, ServerMinute
from app.traffic.services.scrapes import record_scrape
from collectors.metrics.parse import parse_metrics
from tests.support.captures import VLLM_CPU_FIXTURES
from tests.support.server_traffic import a_served_server, metrics_page

pytestmark = pytest.mark.django_db


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def independent_minutes(server: Server) -> dict[datetime, dict[str, float]]:
    """Per minute, from the stored raw rows in Python: counter growth (reset counted in full, none
    across a silence longer than SCRAPE_GAP) in the later pull's minute, KV usage, pulls, evictions."""
    found: dict[datetime, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    names = dict(MetricSeries.objects.filter(server=server).values_list("pk", "name"))
    groups = {
        "vllm:prefix_cache_queries_total": "prefix_queries", "vllm:prefix_cache_hits_total": "prefix_hits",
        "vllm:num_preemptions_total": "preemptions", "vllm:request_success_total": "finished_requests",
        "vllm:time_to_first_token_seconds_count": "ttft_count",
    }  # fmt: skip
    last: dict[int, tuple[datetime, float]] = {}
    for sample in ScrapeSample.objects.filter(server=server).order_by("scraped_at"):
        name = names[sample.series_id]
        minute = found[_minute(sample.scraped_at)]
        if name == "vllm:kv_cache_usage_perc":
            minute["kv_usage_sum"] += sample.value
            minute["kv_usage_samples"] += 1
        previous = last.get(sample.series_id)
        last[sample.series_id] = (sample.scraped_at, sample.value)
        if name in groups and previous and sample.scraped_at - previous[0] <= SCRAPE_GAP:
            grown = sample.value - previous[1]
            minute[groups[name]] += sample.value if grown < 0 else grown
    for scrape in Scrape.objects.filter(server=server):
        found[_minute(scrape.scraped_at)]["scrapes"] += 1
    for event in KVEvent.objects.filter(server=server, kind=KVEvent.Kind.REMOVED):
        found[_minute(event.emitted_at)]["evictions"] += 1
    return found


FIELDS = ("scrapes", "prefix_queries", "prefix_hits", "preemptions", "finished_requests", "kv_usage_sum",
          "kv_usage_samples", "ttft_count", "evictions")  # fmt: skip


def test_the_minutes_equal_the_raw_pulls_and_events_they_sum_across_a_reset_and_a_silence() -> None:
    server, start = a_served_server()
    last = start + timedelta(minutes=10)
    # The server restarts (counters from zero), then is silent longer than SCRAPE_GAP.
    for n, at in [(3, last + timedelta(seconds=30)), (9, last + SCRAPE_GAP + timedelta(minutes=2))]:
        record_scrape(
            server=server, scraped_at=at, samples=parse_metrics(metrics_page(n)), duration_seconds=0.01
        )

    refresh_server_minutes(since=start - timedelta(hours=1), until=timezone.now())

    expected = independent_minutes(server)
    rows = {row.minute: row for row in ServerMinute.objects.filter(server=server)}
    assert set(rows) == set(expected)
    for minute, row in rows.items():
        assert {f: getattr(row, f) for f in FIELDS} == pytest.approx(
            {f: expected[minute][f] for f in FIELDS}
        ), minute
    assert sum(row.evictions for row in rows.values()) == 2
    assert (
        sum(row.prefix_queries for row in rows.values()) == 100 * 24 + 300
    )  # 24 steps, then the restart's 3


def test_the_hours_are_their_minutes_summed_and_a_rerun_changes_nothing() -> None:
    server, start = a_served_server()
    for _ in range(2):
        refresh_server_minutes(since=start - timedelta(hours=2), until=timezone.now())
    minutes = list(ServerMinute.objects.filter(server=server).values())
    hours = {row.hour: row for row in ServerHour.objects.filter(server=server)}
    assert len(minutes) == len(set(m["minute"] for m in minutes))  # one row per minute, rerun or not
    for hour, row in hours.items():
        inside = [m for m in minutes if m["minute"].replace(minute=0) == hour]
        assert row.prefix_hits == sum(m["prefix_hits"] for m in inside)
        assert row.kv_usage_samples == sum(m["kv_usage_samples"] for m in inside)
        assert row.kv_usage_max == max(m["kv_usage_max"] or 0.0 for m in inside)
    assert sum(row.scrapes for row in hours.values()) == Scrape.objects.filter(server=server).count()


def test_vllms_ttft_histogram_is_rolled_up_by_its_bucket_bounds() -> None:
    """Two real vLLM 0.32 pages, before and after 18 requests: the minute holds their growth."""
    server = Server.objects.create(name="vllm-cpu", base_url="http://vllm-cpu:8000")
    at = timezone.now().replace(second=10, microsecond=0) - timedelta(minutes=5)
    for offset, name in enumerate(["metrics-before.txt", "metrics-after.txt"]):
        page = (VLLM_CPU_FIXTURES / name).read_text(encoding="utf-8")
        scraped_at = at + timedelta(seconds=30 * offset)
        record_scrape(
            server=server, scraped_at=scraped_at, samples=parse_metrics(page), duration_seconds=0.01
        )

    refresh_server_minutes(since=at, until=at + timedelta(minutes=1))

    row = ServerMinute.objects.get(server=server, minute=_minute(at))
    after = parse_metrics((VLLM_CPU_FIXTURES / "metrics-after.txt").read_text(encoding="utf-8"))
    le = {dict(s.labels)["le"]: s.value for s in after if s.name == "vllm:time_to_first_token_seconds_bucket"}
    expected = [le[repr(b)] for b in TTFT_BUCKETS_SECONDS] + [le["+Inf"]]
    assert row.ttft_buckets == expected and expected[-1] == 18
    assert (row.ttft_count, row.prefix_queries, row.prefix_hits, row.finished_requests) == (18, 4026, 960, 18)
    assert row.scrapes == 2 and row.kv_usage_samples == 2


@pytest.mark.parametrize("metric", SERVER_METRICS)
@pytest.mark.parametrize("bucket", [300, 3600])
def test_a_servers_long_series_read_from_the_rollups_equal_the_raw_rows(metric: str, bucket: int) -> None:
    server, start = a_served_server()
    refresh_server_minutes(since=start - timedelta(minutes=5), until=timezone.now())
    query = parse_query(
        {"metric": metric, "scope": "server", "id": str(server.pk), "bucket": str(bucket),
         "since": (start - timedelta(hours=2)).isoformat()},
        now=timezone.now(),
    )  # fmt: skip

    rolled_up, raw = series(query), raw_server_series(query, server.pk)

    assert rolled_up.source in ("traffic_serverminute", "traffic_serverhour")
    assert rolled_up.series[0].values == pytest.approx(raw.series[0].values, nan_ok=True)
    assert any(v for v in raw.series[0].values)
