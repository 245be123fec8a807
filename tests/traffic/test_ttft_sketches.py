"""TTFT quantiles read from the rollups (minutes, hours, the per-server and per-template sums) are
within 1 % of the exact quantiles of the stored records."""

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from app.core.tenancy import SEES_ALL
from app.prompts.models import Template
from app.rollups.refresh import refresh_minute_rollups
from app.rollups.series import SeriesQuery, series
from app.traffic.models import HourRollup, RequestRecord
from app.traffic.services.partitions import ensure_day_partitions
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 9, 45, tzinfo=UTC)  # 30 minutes across 10:00
MINUTES = 30
QUANTILES = {"ttft_p50": 0.5, "ttft_p90": 0.9, "ttft_p99": 0.99}


@pytest.fixture
def stored() -> list[RequestRecord]:
    """Two servers and two templates (and none), ~40 requests a minute each, TTFTs of about 131 ms
    with a long tail (vLLM's own a little less), rolled up by the product's service."""
    servers = [a_server(name=f"vllm-{n}") for n in range(2)]
    templates = [Template.objects.create(name=f"tpl-{n}") for n in range(2)] + [None]
    noise, records = random.Random(3), []
    for n in range(MINUTES * 40):
        client = 0.131 * noise.lognormvariate(0, 0.35)
        records.append(
            RequestRecord(
                server=servers[n % 2],
                template=templates[n % 3],
                request_id=f"r{n}",
                source="rest",
                arrived_at=START + timedelta(seconds=n * 60 * MINUTES / (MINUTES * 40)),
                prompt_tokens=1000,
                cached_tokens=500,
                client_ttft_seconds=client,
                server_ttft_seconds=None if n % 7 == 0 else client * 0.8,
            )
        )
    ensure_day_partitions(RequestRecord, [r.arrived_at for r in records])
    RequestRecord.objects.bulk_create(records)
    refresh_minute_rollups(since=START, until=START + timedelta(minutes=MINUTES))
    return records


def _exact(q: float, values: list[float]) -> float:
    return sorted(values)[max(math.ceil(q * len(values)), 1) - 1]  # percentile_disc


@pytest.mark.parametrize("bucket", [60, 300, 3600])
@pytest.mark.parametrize("scope", ["fleet", "server", "template"])
@pytest.mark.parametrize("ttft", ["client", "server"])
def test_quantiles_from_the_rollups_are_within_one_percent_of_the_records(
    stored: list[RequestRecord], bucket: int, scope: str, ttft: str
) -> None:
    ident = {"fleet": "", "server": str(stored[0].server_id), "template": str(stored[0].template_id)}[scope]
    since, until = START.replace(minute=0), START.replace(minute=0) + timedelta(hours=2)
    for metric, q in QUANTILES.items():
        found = series(SeriesQuery(metric, scope, ident, since, until, bucket, ttft), viewer=SEES_ALL)
        (line,) = found.series
        compared = 0
        for at, value in zip(found.times, line.values, strict=True):
            values = [
                getattr(r, f"{ttft}_ttft_seconds") for r in stored
                if at <= r.arrived_at < at + timedelta(seconds=bucket)
                and getattr(r, f"{ttft}_ttft_seconds") is not None
                and (scope != "server" or r.server_id == int(ident))
                and (scope != "template" or r.template_id == int(ident))
            ]  # fmt: skip
            if not values:
                assert value is None
                continue
            assert value == pytest.approx(_exact(q, values), rel=0.01), (metric, at)
            compared += 1
        assert compared


def test_sketches_are_summed_by_grouped_queries_not_a_custom_aggregate(stored: list[RequestRecord]) -> None:
    # An aggregate folding one row at a time made the refresh 7.5 times slower (bench/bench_rollups.py).
    with connection.cursor() as cursor:
        cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'prefixscope_sketch%%'")
        assert cursor.fetchall() == []
    hours = HourRollup.objects.filter(client_ttft_count__gt=0)
    assert hours and all(sum(h.client_ttft_sketch.values()) == h.client_ttft_count for h in hours)
