"""The hour rollups summed per server (ServerRequestHour) and per server and tenant (ServerLossHour)
equal the raw records and diagnoses summed apart, hours cut across; and what the Fleet page and the
fleet's hourly series read through them is, for every viewer, what the per-template rollups it sees
(app/core/tenancy.py rollups() and traffic()) sum to."""

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext

from app.core.tenancy import SEES_ALL, SEES_NOTHING, Viewer
from app.diagnosis.reads import routing_effectiveness
from app.diagnosis.tenants import tenant_audit
from app.domain.sketch import merged, sketch_quantile
from app.fleet.models import Server
from app.prompts.models import Template
from app.rollups.refresh import refresh_loss_minutes, refresh_minute_rollups
from app.rollups.series import SeriesQuery, series
from app.rollups.sums import (
    LOSS_ROLLUPS,
    REQUEST_ROLLUPS,
    SERVER_ROLLUPS,
    window_sums,
    windows_totals,
)
from app.rollups.visibility import visible
from app.traffic.models import (
    HourRollup,
    LossHour,
    LossMinute,
    MinuteRollup,
    RequestDiagnosis,
    RequestRecord,
)
from app.traffic.services.partitions import ensure_day_partitions

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
RECORDS = 90  # one every 7 minutes and 13 seconds: 10 h 50 min, every hour cut across
VIEWERS = {
    "admin": SEES_ALL,
    "acme": Viewer(frozenset({"acme"})),
    "globex and hooli": Viewer(frozenset({"globex", "hooli"})),
    "nobody": SEES_NOTHING,
}


def _hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def _quarter(at: datetime) -> datetime:
    return at.replace(minute=at.minute - at.minute % 15, second=0, microsecond=0)


@pytest.fixture
def stored() -> list[RequestRecord]:
    """Records and their diagnoses on servers of acme and globex and a shared one, of templates of
    acme, globex, shared and none, with tenants acme, globex, hooli and none; rolled up by the
    product's services (minutes, hours, and the hours' per-server sums)."""
    servers = [
        Server.objects.create(
            name=f"vllm-{tenant or 'shared'}", base_url=f"http://{tenant}:8000", tenant=tenant
        )
        for tenant in ("acme", "globex", "")
    ]
    templates: list[Template | None] = [
        Template.objects.create(name=f"tpl-{tenant or 'shared'}", tenant=tenant)
        for tenant in ("acme", "globex", "")
    ]
    templates.append(None)
    tenants = ("acme", "globex", "hooli", "")
    records, diagnoses = [], []
    for n in range(RECORDS):
        at = START + n * timedelta(minutes=7, seconds=13)
        server, template, tenant = servers[n % 3], templates[n % 4], tenants[n // 5 % 4]
        key = {
            "server": server,
            "request_id": f"r{n}",
            "arrived_at": at,
            "tenant": tenant,
            "template": template,
        }
        records.append(RequestRecord(
            **key, source="rest", prompt_tokens=1000 + n, cached_tokens=None if n % 11 == 0 else 10 * n,
            client_ttft_seconds=0.01 * n, server_ttft_seconds=0.005 * n,
        ))  # fmt: skip
        diagnoses.append(RequestDiagnosis(
            **key, diagnosed_at=at, prompt_tokens=1000 + n, reused_tokens=10 * n, evicted_tokens=n,
            salt_tokens=2 * (n % 5), unexpected_hit=n % 13 == 0,
        ))  # fmt: skip
    ensure_day_partitions(RequestRecord, [r.arrived_at for r in records])
    ensure_day_partitions(RequestDiagnosis, [r.arrived_at for r in records])
    RequestRecord.objects.bulk_create(records)
    RequestDiagnosis.objects.bulk_create(diagnoses)
    end = START + timedelta(hours=12)
    refresh_minute_rollups(since=START, until=end)
    refresh_loss_minutes(since=START, until=end)
    # Among them, what only the per-template rollups tell a tenant: acme's template on the shared
    # server, without a tenant, in a whole hour.
    assert LossHour.objects.filter(tenant="", template__tenant="acme", server__tenant="").exists()
    return records


def _seen_sums(rows: Any, viewer: Viewer, *, loss: bool, by: str, sums: dict[str, Any]) -> dict[Any, Any]:
    seen = viewer.traffic(rows) if loss else visible(viewer, rows)
    if not by:
        return {"": seen.aggregate(**sums)}
    return {row[by]: {name: row[name] for name in sums} for row in seen.values(by).annotate(**sums)}


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
@pytest.mark.parametrize("by", ["server_id", ""])
def test_the_fleet_pages_sums_are_the_rollups_the_viewer_sees(
    stored: list[RequestRecord], viewer: Viewer, by: str
) -> None:
    """A window of whole hours and minutes at both edges: the sums the Fleet page reads (per server
    and in total) equal the per-template minute and hour rows the viewer sees, summed apart."""
    since, until = START + timedelta(minutes=23), START + timedelta(hours=9, minutes=41)
    servers = viewer.servers(Server.objects.all())
    for rollups, loss, sums in (
        (REQUEST_ROLLUPS, False, {"requests": Sum("requests"), "cached": Sum("cached_tokens")}),
        (LOSS_ROLLUPS, True, {"evicted": Sum("evicted_tokens"), "salt": Sum("salt_tokens")}),
    ):
        found = window_sums(rollups, servers, since=since, until=until, sums=sums, by=by, viewer=viewer)
        minute, hour = (LossMinute, LossHour) if loss else (MinuteRollup, HourRollup)
        parts = [
            minute.objects.filter(minute__gte=since, minute__lt=START + timedelta(hours=1)),
            hour.objects.filter(hour__gte=START + timedelta(hours=1), hour__lt=START + timedelta(hours=9)),
            minute.objects.filter(minute__gte=START + timedelta(hours=9), minute__lt=until),
        ]
        expected: dict[Any, dict[str, int]] = {}
        for part in parts:
            for key, values in _seen_sums(
                part.filter(server__in=servers), viewer, loss=loss, by=by, sums=sums
            ).items():
                for name, value in values.items():
                    total = expected.setdefault(key, dict.fromkeys(sums, 0))
                    total[name] += value or 0
        assert {k: {n: v or 0 for n, v in values.items()} for k, values in found.items()} == expected
    if viewer is SEES_ALL:  # the rows cut across: the shared server's of tenants' templates too
        assert len(found) in (1, 3)


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
@pytest.mark.parametrize("metric", ["requests", "hit_rate", "ttft_p50"])
def test_the_fleets_hourly_series_are_the_hour_rollups_the_viewer_sees(
    stored: list[RequestRecord], viewer: Viewer, metric: str
) -> None:
    query = SeriesQuery(metric, "fleet", "", START, START + timedelta(hours=12), 3600)
    found = series(query, viewer=viewer)
    assert found.source == "traffic_serverrequesthour"
    seen = visible(viewer, HourRollup.objects.all())
    expected = []
    for at in found.times:
        rows = list(seen.filter(hour=at))
        requests = sum(r.requests for r in rows)
        known = sum(r.cache_known_prompt_tokens for r in rows)
        sketch = merged(r.client_ttft_sketch for r in rows)
        expected.append(
            float(requests) if metric == "requests"
            else (sum(r.cached_tokens for r in rows) / known if known else None) if metric == "hit_rate"
            else sketch_quantile(0.5, sketch) if rows else None
        )  # fmt: skip
    assert found.series[0].values == pytest.approx(expected)
    if viewer is not SEES_NOTHING and metric == "requests":
        assert sum(value or 0 for value in expected) > 0


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
@pytest.mark.parametrize(
    ("bucket", "source"), [(900, "traffic_serverlossquarter"), (3600, "traffic_serverlosshour")]
)
@pytest.mark.parametrize("scope", ["fleet", "tenant"])
def test_lost_tokens_by_quarter_hour_and_hour_are_the_loss_minutes_the_viewer_sees(
    stored: list[RequestRecord], viewer: Viewer, bucket: int, source: str, scope: str
) -> None:
    """The fleet's and a tenant's lost tokens (and a tenant's hit rate) per 15 minutes and per hour,
    read from the sums per server and tenant, equal the per-template minutes the viewer sees."""
    for ident in [""] if scope == "fleet" else ["acme", "globex", "hooli"]:
        query = SeriesQuery("lost_tokens", scope, ident, START, START + timedelta(hours=12), bucket)
        found = series(query, viewer=viewer)
        assert found.source == source
        seen = viewer.traffic(LossMinute.objects.all()).filter(**({"tenant": ident} if ident else {}))
        per_bucket: dict[datetime, list[int]] = defaultdict(lambda: [0, 0, 0])
        for row in seen:
            start = START + (row.minute - START) // timedelta(seconds=bucket) * timedelta(seconds=bucket)
            sums = per_bucket[start]
            sums[0] += row.evicted_tokens
            sums[1] += row.reused_tokens
            sums[2] += row.diagnosed_prompt_tokens
        evicted = {s.name: s.values for s in found.series}.get("evicted", [0.0] * len(found.times))
        assert evicted == [float(per_bucket[at][0]) for at in found.times]
        if ident:
            rate = series(SeriesQuery("hit_rate", scope, ident, START, query.until, bucket), viewer=viewer)
            assert rate.source == source
            expected = [
                per_bucket[at][1] / per_bucket[at][2] if per_bucket[at][2] else None for at in rate.times
            ]
            assert rate.series[0].values == pytest.approx(expected)


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
def test_the_cards_windows_read_at_once_are_each_window_read_alone(
    stored: list[RequestRecord], viewer: Viewer
) -> None:
    """The Fleet page's cards read several windows in one query a table (windows_totals): each
    window's totals are window_sums' of it alone, windows of minutes, of whole hours and of both."""
    end = START + timedelta(hours=9, minutes=41, seconds=12)
    hour = timedelta(hours=1)
    windows = [
        (end - timedelta(minutes=4), end), (end - hour, end), (START + timedelta(minutes=7), end),
        (START + hour, START + 8 * hour), (START + timedelta(minutes=30), START + hour),
    ]  # fmt: skip
    servers = viewer.servers(Server.objects.all())
    for rollups, sums in (
        (REQUEST_ROLLUPS, {"cached": Sum("cached_tokens"), "known": Sum("cache_known_prompt_tokens")}),
        (LOSS_ROLLUPS, {"evicted": Sum("evicted_tokens")}),
        (SERVER_ROLLUPS, {"scrapes": Sum("scrapes")}),
    ):
        alone = [
            window_sums(rollups, servers, since=since, until=until, sums=sums, by="", viewer=viewer)[""]
            for since, until in windows
        ]
        assert windows_totals(rollups, servers, windows, sums=sums, viewer=viewer) == alone
        if viewer is SEES_ALL and rollups is REQUEST_ROLLUPS:
            assert len({total["cached"] for total in alone}) == len(windows)  # windows told apart


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
def test_the_tenant_audit_is_the_loss_minutes_the_viewer_sees_summed_per_tenant(
    stored: list[RequestRecord], viewer: Viewer
) -> None:
    """The Tenants page's sums (tenant_audit: per-server hours and quarters, minutes at the edges)
    equal the loss minutes the viewer sees (Viewer.traffic), summed per tenant apart."""
    since, until = START + timedelta(minutes=23, seconds=10), START + timedelta(hours=9, minutes=41)
    minutes = viewer.traffic(LossMinute.objects.filter(minute__gte=since, minute__lt=until))
    sums = {"requests": Sum("requests"), "salt": Sum("salt_tokens"), "unexpected": Sum("unexpected_hits"),
            "lost": Sum("evicted_tokens") + Sum("salt_tokens")}  # the fixture's only losses  # fmt: skip
    rows: Any = minutes.values("tenant").annotate(**sums)
    expected = {row["tenant"]: {name: row[name] for name in sums} for row in rows}
    found = {
        row.tenant: {"requests": row.requests, "salt": row.salt_tokens, "lost": row.lost_tokens,
                     "unexpected": row.unexpected_hits}
        for row in tenant_audit(since=since, until=until, viewer=viewer)
    }  # fmt: skip
    assert found == expected
    if viewer is SEES_ALL:
        assert set(found) == {"acme", "globex", "hooli", ""}


# The minutes summed per server (ServerRequestMinute) and per server and tenant (ServerLossMinute):
# what the Fleet page reads for the minutes of its window, kept by the same services.


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
@pytest.mark.parametrize("by", ["server_id", ""])
def test_a_window_of_minutes_sums_the_per_server_minutes_as_the_rollups_the_viewer_sees(
    stored: list[RequestRecord], viewer: Viewer, by: str
) -> None:
    """The Fleet page's last hour (no whole hour in it): per server and in total, read from the sums
    per server (and tenant), the per-template minute rows the viewer sees summed apart."""
    since, until = START + timedelta(hours=3, minutes=23), START + timedelta(hours=4, minutes=23)
    servers = viewer.servers(Server.objects.all())
    for rollups, loss, sums in (
        (REQUEST_ROLLUPS, False, {"requests": Sum("requests"), "cached": Sum("cached_tokens")}),
        (LOSS_ROLLUPS, True, {"evicted": Sum("evicted_tokens"), "salt": Sum("salt_tokens")}),
    ):
        with CaptureQueriesContext(connection) as queries:
            found = window_sums(rollups, servers, since=since, until=until, sums=sums, by=by, viewer=viewer)
        minutes = rollups[0].objects.filter(minute__gte=since, minute__lt=until, server__in=servers)
        expected = _seen_sums(minutes, viewer, loss=loss, by=by, sums=sums)
        assert {k: {n: v or 0 for n, v in values.items()} for k, values in found.items()} == {
            k: {n: v or 0 for n, v in values.items()} for k, values in expected.items()
        }
        read = " ".join(query["sql"] for query in queries.captured_queries)
        summed = "traffic_serverlossminute" if loss else "traffic_serverrequestminute"
        assert (summed in read) is (viewer is not SEES_NOTHING)
        assert (f'{rollups[0]._meta.db_table}"' in read) is (viewer not in (SEES_ALL, SEES_NOTHING))
    if viewer is SEES_ALL:
        assert sum(values["evicted"] for values in found.values()) > 0


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
def test_routing_effectiveness_sums_the_loss_rollups_the_viewer_sees_per_server(
    stored: list[RequestRecord], viewer: Viewer
) -> None:
    """Per server (its group here: the fixture's servers serve one model each way alike), from the
    sums per server and tenant: the per-template minutes and hours the viewer sees, summed apart."""
    since, until = START + timedelta(minutes=23), START + timedelta(hours=9, minutes=41)
    parts: list[Any] = [
        LossMinute.objects.filter(minute__gte=since, minute__lt=START + timedelta(hours=1)),
        LossHour.objects.filter(hour__gte=START + timedelta(hours=1), hour__lt=START + timedelta(hours=9)),
        LossMinute.objects.filter(minute__gte=START + timedelta(hours=9), minute__lt=until),
    ]
    names = dict(Server.objects.values_list("pk", "name"))
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for part in parts:
        for row in viewer.traffic(part):
            sums = expected[names[row.server_id]]
            sums[0] += row.requests
            sums[1] += row.reused_tokens
            sums[2] += row.resident_anywhere_tokens
    found = routing_effectiveness(since=since, until=until, viewer=viewer)
    if viewer is SEES_NOTHING:
        assert found == [] and not expected
        return
    (group,) = found
    assert group.servers == sorted(expected)
    totals = [sum(sums[i] for sums in expected.values()) for i in range(3)]
    assert [group.requests, group.reused_tokens, group.resident_anywhere_tokens] == totals
    assert totals[0] > 0
