"""GET /api/v1/series: what the rollups hold for known requests, summed per bucket, as JSON and CSV.

Records go in through the ingest service and the minute rollups are refreshed as the task does; the
numbers below are worked out by hand from the records.
"""

import csv
import io
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.prompts.models import Template
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import LossMinute
from tests.support.factories import a_server, facts, ingested
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


@pytest.fixture
def start() -> datetime:
    """The start of a five-minute bucket half an hour ago: the records' first minute."""
    now = timezone.now().replace(second=0, microsecond=0)
    return now - timedelta(minutes=30 + now.minute % 5)


@pytest.fixture
def traffic(start: datetime) -> datetime:
    """Two servers' requests over two five-minute buckets, their minutes rolled up."""
    a, b = a_server(name="vllm-a").name, a_server(name="vllm-b").name
    second = start + timedelta(seconds=20)
    ingested(
        # bucket 1, minute 1: 800 of 1,000 cached, then 0 of 100
        facts(
            server=a,
            arrived_at=second,
            prompt_tokens=1000,
            cached_tokens=800,
            client_ttft_seconds=0.3,
            server_ttft_seconds=0.2,
            template="support",
        ),
        facts(
            server=a,
            arrived_at=second,
            prompt_tokens=100,
            cached_tokens=0,
            client_ttft_seconds=0.9,
            template="support",
        ),
        # bucket 1, minute 2: 100 of 400
        facts(
            server=a,
            arrived_at=second + timedelta(minutes=1),
            prompt_tokens=400,
            cached_tokens=100,
            client_ttft_seconds=0.05,
        ),
        # bucket 1, no cached tokens reported: counts as a request, not in the hit rate
        facts(server=a, arrived_at=second + timedelta(minutes=2), prompt_tokens=3000),
        # bucket 2: 200 of 200
        facts(
            server=a,
            arrived_at=second + timedelta(minutes=5),
            prompt_tokens=200,
            cached_tokens=200,
            client_ttft_seconds=0.05,
        ),
        # another server, bucket 1: 500 of 500
        facts(server=b, arrived_at=second, prompt_tokens=500, cached_tokens=500),
    )
    refresh_minute_rollups(since=start, until=start + timedelta(minutes=10))
    return start


def get(client: Client, **params: Any) -> Any:
    response = client.get("/api/v1/series", params)
    assert response.status_code == 200, response.content
    return response.json()


def window(start: datetime, minutes: int = 10) -> dict[str, str]:
    return {"since": start.isoformat(), "until": (start + timedelta(minutes=minutes)).isoformat()}


def test_a_buckets_hit_rate_weighs_requests_by_their_tokens(signed_in: Client, traffic: datetime) -> None:
    found = get(signed_in, metric="hit_rate", scope="server", id="vllm-a", bucket=300, **window(traffic))
    # (800 + 0 + 100) / (1,000 + 100 + 400), not the mean of the ratios 0.8, 0 and 0.25
    assert found["series"] == [{"name": "hit_rate", "values": [0.6, 1.0]}]
    starts = [traffic, traffic + timedelta(minutes=5)]
    assert found["times"] == [at.isoformat().replace("+00:00", "Z") for at in starts]
    assert (found["unit"], found["source"], found["bucket"]) == ("ratio", "traffic_minuterollup", 300)


def test_minute_buckets_hold_each_minute_and_none_where_nothing_was_cached_or_known(
    signed_in: Client, traffic: datetime
) -> None:
    found = get(signed_in, metric="hit_rate", scope="server", id="vllm-a", bucket=60, **window(traffic, 6))
    assert found["series"][0]["values"] == [pytest.approx(800 / 1100), 0.25, None, None, None, 1.0]


def test_the_fleet_sums_every_server_and_a_server_is_named_by_id_or_name(
    signed_in: Client, traffic: datetime
) -> None:
    fleet = get(signed_in, metric="hit_rate", bucket=300, **window(traffic))
    assert fleet["series"][0]["values"] == [(900 + 500) / (1500 + 500), 1.0]
    by_id = Server.objects.get(name="vllm-b").pk
    server = get(signed_in, metric="requests", scope="server", id=str(by_id), bucket=300, **window(traffic))
    assert server["series"][0]["values"] == [1.0, 0.0]
    requests = get(signed_in, metric="requests", bucket=300, **window(traffic))
    assert requests["series"][0]["values"] == [5.0, 1.0]


def test_a_templates_series_reads_its_own_requests(signed_in: Client, traffic: datetime) -> None:
    template = Template.objects.get(name="support")
    found = get(signed_in, metric="hit_rate", scope="template", id=template.pk, bucket=300, **window(traffic))
    assert found["series"][0]["values"] == [800 / 1100, None]


def test_ttft_quantiles_come_from_the_buckets_summed_histogram_client_or_vllms_own(
    signed_in: Client, traffic: datetime
) -> None:
    client_p50 = get(signed_in, metric="ttft_p50", bucket=300, **window(traffic))
    # 0.05, 0.3 and 0.9 s: the median is the second, read within 0.5 % (the quantile sketch)
    assert client_p50["series"] == [
        {
            "name": "ttft_p50 (client)",
            "values": [pytest.approx(0.3, rel=0.005), pytest.approx(0.05, rel=0.005)],
        }
    ]
    assert client_p50["ttft"] == "client" and client_p50["unit"] == "seconds"
    server_p50 = get(signed_in, metric="ttft_p50", ttft="server", bucket=300, **window(traffic))
    # vLLM measured one request, 0.2 s
    assert server_p50["series"][0]["values"] == [pytest.approx(0.2, rel=0.005), None]
    p99 = get(signed_in, metric="ttft_p99", bucket=300, **window(traffic))["series"][0]["values"]
    assert p99[0] == pytest.approx(0.9, rel=0.005)  # the 0.9 s request's


def test_the_csv_is_the_same_series_as_the_json(signed_in: Client, traffic: datetime) -> None:
    params: dict[str, Any] = {"metric": "hit_rate", "bucket": 60, **window(traffic)}
    found = get(signed_in, **params)
    for response in (
        signed_in.get("/api/v1/series", {**params, "format": "csv"}),
        signed_in.get("/api/v1/series", params, headers={"Accept": "text/csv"}),
    ):
        assert response["Content-Type"].startswith("text/csv")
        rows = list(csv.reader(io.StringIO(response.content.decode())))
        assert rows[0] == ["time", "hit_rate"]
        times = [datetime.fromisoformat(row[0]) for row in rows[1:]]
        assert times == [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in found["times"]]
        assert [float(row[1]) if row[1] else None for row in rows[1:]] == found["series"][0]["values"]


def test_lost_tokens_come_per_cause_from_the_loss_rollups(signed_in: Client, start: datetime) -> None:
    a_server(name="vllm-a")
    prompt = list(range(1, 101))  # 100 tokens: six blocks of 16 and a tail of 4
    sent = [
        facts(
            server="vllm-a",
            arrived_at=start + timedelta(seconds=10 + n),
            prompt_tokens=100,
            cached_tokens=0,
            prompt_token_ids=prompt,
            tenant="acme",
        )
        for n in range(2)
    ]
    ingested(*sent)
    assert diagnose_requests(now=timezone.now()) == 2
    held = LossMinute.objects.filter(minute=start).aggregate(
        evicted=Sum("no_kv_events_tokens"), tail=Sum("below_block_tokens"), cold=Sum("cold_tokens")
    )

    found = get(signed_in, metric="lost_tokens", scope="tenant", id="acme", bucket=300, **window(start))
    lost = {s["name"]: s["values"] for s in found["series"]}
    assert found["source"] == "traffic_lossminute" and found["unit"] == "tokens"
    # Every prompt token of both requests lost, but their tails below one block: never reusable,
    # not a loss, so not in the series.
    assert sum(v[0] for v in lost.values()) == 2 * 100 - held["tail"] and held["tail"] == 2 * 4
    assert lost.get("no_kv_events", [0])[0] == (held["evicted"] or 0)
    assert "below_block" not in lost
    assert lost.get("cold", [0])[0] == (held["cold"] or 0)
    assert all(values[1] == 0 for values in lost.values())
    params: dict[str, Any] = {"metric": "lost_tokens", "scope": "tenant", "id": "acme", "bucket": 300}
    answer = signed_in.get("/api/v1/series", {**params, "format": "csv", **window(start)})
    csv_rows = list(csv.reader(io.StringIO(answer.content.decode())))
    assert csv_rows[0] == ["time", *lost]
    assert [float(cell) for cell in csv_rows[1][1:]] == [values[0] for values in lost.values()]
    hour = start.replace(minute=0)
    by_hour = {"since": hour.isoformat(), "until": (hour + timedelta(hours=1)).isoformat(), "bucket": 3600}
    hourly = get(signed_in, metric="lost_tokens", scope="tenant", id="acme", **by_hour)
    assert (
        hourly["source"] == "traffic_serverlosshour"
    )  # the hour summed from its minutes by the diagnosis task
    assert {s["name"]: s["values"] for s in hourly["series"]} == {name: [v[0]] for name, v in lost.items()}


def test_hour_buckets_read_the_hourly_rollup_which_follows_its_minutes(
    signed_in: Client, start: datetime
) -> None:
    a_server(name="vllm-a")
    hour = start.replace(minute=0)

    def arrive(minute: int, prompt: int, cached: int, ttft: float | None = None) -> None:
        at = hour + timedelta(minutes=minute, seconds=5)
        sent = facts(
            server="vllm-a",
            arrived_at=at,
            prompt_tokens=prompt,
            cached_tokens=cached,
            client_ttft_seconds=ttft,
        )
        ingested(sent)
        refresh_minute_rollups(since=at, until=at)  # that minute alone, as the task's window would

    arrive(1, 1000, 500, 0.3)
    arrive(50, 3000, 3000, 0.9)
    params = {
        "metric": "hit_rate",
        "bucket": 3600,
        "since": hour.isoformat(),
        "until": (hour + timedelta(hours=1)).isoformat(),
    }
    found = get(signed_in, **params)
    assert found["source"] == "traffic_serverrequesthour"  # the fleet: the hours summed per server
    assert found["series"][0]["values"] == [3500 / 4000]
    (p50,) = get(signed_in, **{**params, "metric": "ttft_p50"})["series"][0]["values"]
    assert p50 == pytest.approx(0.3, rel=0.005)  # 0.3 and 0.9 s: the first

    arrive(10, 4000, 0)  # late, into a minute of an hour already summed
    assert get(signed_in, **params)["series"][0]["values"] == [3500 / 8000]
    minutes = get(signed_in, **{**params, "bucket": 60})
    assert minutes["source"] == "traffic_minuterollup"
    assert sum(v for v in minutes["series"][0]["values"] if v is not None) == 0.5 + 0 + 1.0


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({}, "bad_metric"),
        ({"metric": "nope"}, "bad_metric"),
        ({"metric": "hit_rate", "scope": "galaxy"}, "bad_scope"),
        ({"metric": "hit_rate", "scope": "server"}, "bad_id"),
        ({"metric": "hit_rate", "id": "7"}, "bad_id"),
        ({"metric": "hit_rate", "scope": "template", "id": "x"}, "unknown_template"),
        ({"metric": "hit_rate", "scope": "server", "id": "no-such-server"}, "unknown_server"),
        ({"metric": "ttft_p90", "scope": "tenant", "id": "acme"}, "bad_scope"),
        ({"metric": "kv_usage"}, "bad_scope"),
        ({"metric": "hit_rate", "bucket": "7"}, "bad_bucket"),
        ({"metric": "hit_rate", "since": "yesterday"}, "bad_since"),
        ({"metric": "hit_rate", "until": "1e400"}, "bad_until"),
        (
            {"metric": "hit_rate", "since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
            "bad_window",
        ),
        (
            {"metric": "hit_rate", "since": "2025-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
            "bad_window",
        ),
        (
            {"metric": "hit_rate", "since": "2026-01-01T00:00:00Z", "until": "2026-01-05T00:00:00Z"},
            "bad_bucket",
        ),
        ({"metric": "hit_rate", "ttft": "both"}, "bad_ttft"),
        ({"metric": "hit_rate", "until": "9999-12-31T23:59:59"}, "bad_until"),
        ({"metric": "hit_rate", "scope": "template", "id": "99999999999999999999"}, "unknown_template"),
        ({"metric": "hit_rate", "scope": "server", "id": "99999999999999999999"}, "unknown_server"),
        ({"metric": "hit_rate", "scope": "tenant", "id": "a\x00b"}, "bad_id"),
        ({"metric": "hit_rate", "scope": "tenant", "id": "a" * 256}, "bad_id"),
    ],
)
def test_a_bad_parameter_is_a_400_with_a_code_and_a_message(
    signed_in: Client, params: dict[str, str], code: str
) -> None:
    response = signed_in.get("/api/v1/series", params)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == code and body["message"]


def test_the_series_asks_for_a_login_or_a_token(client: Client) -> None:
    assert client.get("/api/v1/series", {"metric": "hit_rate"}).status_code == 401


def test_the_series_is_in_the_openapi_schema_with_its_400(client: Client) -> None:
    operation = client.get("/api/openapi.json").json()["paths"]["/api/v1/series"]["get"]
    assert "400" in operation["responses"]
    assert {p["name"] for p in operation["parameters"]} >= {
        "metric",
        "scope",
        "id",
        "since",
        "until",
        "bucket",
    }
