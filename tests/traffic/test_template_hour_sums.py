"""The hour rollups summed per template (TemplateRequestHour) and per template and tenant
(TemplateLossHour) equal the raw records and diagnoses summed apart; the migration's backfill sums the
same; and what the Templates list and a template's page read through them is, for every viewer, what
the per-server hour rollups it sees (app/core/tenancy.py rollups() and traffic()) of the templates it
sees sum to."""

import importlib
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Q, Sum

from app.core.tenancy import SEES_ALL, SEES_NOTHING, Viewer
from app.dashboard.reads import templates as selectors
from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.domain.sketch import merged
from app.prompts.models import Template
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import (
    LOST_COLUMNS,
    HourRollup,
    LossHour,
    RequestDiagnosis,
    RequestRecord,
    TemplateLossHour,
    TemplateRequestHour,
)
from tests.traffic import test_server_hour_sums as server_sums

pytestmark = pytest.mark.django_db

START, VIEWERS = server_sums.START, server_sums.VIEWERS
stored = server_sums.stored  # records of three servers, four templates (one none), four tenants
HOUR = timedelta(hours=1)
SINCE, UNTIL = START + 5 * HOUR, START + 11 * HOUR  # the window; the one before it from START - HOUR
TOTALS = ("requests", "prompt_tokens", "cached_tokens", "cache_known_prompt_tokens")
FILL = importlib.import_module("app.traffic.migrations.0025_template_hour_sums").FILL_SQL


def _hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def _request_hours() -> dict[tuple[int, datetime], tuple[Any, ...]]:
    return {
        (h.template_id, h.hour): (*(getattr(h, n) for n in TOTALS), h.client_ttft_buckets,
                                  h.server_ttft_buckets, h.prefill_count, h.prefill_cross_sum)
        for h in TemplateRequestHour.objects.all()
    }  # fmt: skip


def _loss_hours() -> dict[tuple[int, str, datetime], tuple[int, ...]]:
    return {
        (h.template_id, h.tenant, h.hour): (h.requests, h.evicted_tokens, h.salt_tokens, h.reused_tokens)
        for h in TemplateLossHour.objects.all()
    }


def test_the_per_template_hours_equal_the_records_and_diagnoses_summed_apart(
    stored: list[RequestRecord],
) -> None:
    expected: dict[tuple[int, datetime], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in stored:
        if r.template_id is None:
            continue
        hour = expected[(r.template_id, _hour(r.arrived_at))]
        hour["requests"] += 1
        hour["prompt_tokens"] += r.prompt_tokens or 0
        hour["cached_tokens"] += r.cached_tokens or 0
        hour["cache_known_prompt_tokens"] += (r.prompt_tokens or 0) if r.cached_tokens is not None else 0
        hour["under_100ms"] += (r.client_ttft_seconds or 0) <= 0.1
    found = {(h.template_id, h.hour): h for h in TemplateRequestHour.objects.all()}
    assert set(found) == set(expected) and len(found) > 3 * 9  # every template in every hour touched
    for key, sums in expected.items():
        assert {name: getattr(found[key], name) for name in TOTALS} == {name: sums[name] for name in TOTALS}
        assert found[key].client_ttft_buckets[TTFT_BUCKETS_SECONDS.index(0.1)] == sums["under_100ms"]

    lost: dict[tuple[int, str, datetime], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for d in RequestDiagnosis.objects.filter(template__isnull=False):
        counted = lost[(d.template_id, d.tenant, _hour(d.arrived_at))]
        for i, value in enumerate((1, d.evicted_tokens, d.salt_tokens, d.reused_tokens)):
            counted[i] += value
    assert _loss_hours() == {key: tuple(sums) for key, sums in lost.items()}


def test_the_per_template_hours_follow_a_late_record_into_an_hour_already_summed(
    stored: list[RequestRecord],
) -> None:
    late = stored[4].arrived_at + timedelta(seconds=1)
    template = stored[4].template
    assert template is not None
    before = TemplateRequestHour.objects.get(template=template, hour=_hour(late)).requests
    RequestRecord.objects.create(
        server=stored[5].server, template=template, request_id="late", arrived_at=late, source="rest",
        prompt_tokens=5,
    )  # fmt: skip
    refresh_minute_rollups(since=late, until=late)  # that minute alone, as the task's window would
    assert TemplateRequestHour.objects.get(template=template, hour=_hour(late)).requests == before + 1


def test_the_migrations_backfill_sums_what_the_services_sum(stored: list[RequestRecord]) -> None:
    requests, losses = _request_hours(), _loss_hours()
    assert requests and losses
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM traffic_templaterequesthour; DELETE FROM traffic_templatelosshour")
        cursor.execute(FILL)
    assert _request_hours() == requests
    assert _loss_hours() == losses


def _seen(rows: Any, viewer: Viewer, *, loss: bool) -> Any:
    """The per-server rows of some template the viewer sees, of the templates it sees."""
    seen = viewer.traffic(rows) if loss else viewer.rollups(rows)
    return seen.filter(template__in=viewer.templates(Template.objects.all()).values("pk"))


def _summed(rows: Any, by: str, sums: dict[str, Any]) -> dict[Any, dict[str, int]]:
    grouped = rows.values(by).annotate(**sums)
    return {row[by]: {name: row[name] or 0 for name in sums} for row in grouped}


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
def test_the_templates_lists_sums_are_the_hour_rollups_the_viewer_sees(
    stored: list[RequestRecord], viewer: Viewer
) -> None:
    """Its totals over the window and the one before, its trends and its lost tokens, read from the
    per-template sums where the viewer may, equal the per-server hour rollups it sees, summed apart."""
    found = selectors.list_sums(since=SINCE, until=UNTIL, bucket=3600, viewer=viewer)
    sums = {name: Sum(name) for name in TOTALS}
    rows = _seen(HourRollup.objects.all(), viewer, loss=False)
    for window, (since, until) in ((found.now, (SINCE, UNTIL)), (found.before, (START - HOUR, SINCE))):
        expected = _summed(rows.filter(hour__gte=since, hour__lt=until), "template_id", sums)
        expected = {pk: totals for pk, totals in expected.items() if totals["requests"]}
        assert {pk: vars_of(totals) for pk, totals in window.items() if totals.requests} == expected
        assert selectors.totals_by_template(since=since, until=until, viewer=viewer) == {
            pk: selectors.Totals(**totals) for pk, totals in expected.items()
        }
    assert selectors.hit_rate_trends(since=SINCE, until=UNTIL, bucket=3600, viewer=viewer) == found.trends
    for pk, trend in found.trends.items():
        for i, rate in enumerate(trend):
            hour = rows.filter(template_id=pk, hour=SINCE + i * HOUR).aggregate(**sums)
            known = hour["cache_known_prompt_tokens"]
            assert rate == (hour["cached_tokens"] / known if known else None)
    lost = selectors.lost_by_template(since=SINCE, until=UNTIL, viewer=viewer)
    losses = _seen(LossHour.objects.filter(hour__gte=SINCE, hour__lt=UNTIL), viewer, loss=True)
    assert lost == _summed(losses, "template_id", {c: Sum(column) for c, column in LOST_COLUMNS.items()})
    if viewer is not SEES_NOTHING:
        assert any(totals.requests for totals in found.now.values())
        assert any(sum(causes.values()) for causes in lost.values())


def vars_of(totals: selectors.Totals) -> dict[str, int]:
    return {name: getattr(totals, name) for name in TOTALS}


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
def test_a_template_pages_reads_are_the_hour_rollups_the_viewer_sees(
    stored: list[RequestRecord], viewer: Viewer
) -> None:
    """Each template the viewer sees, its page over whole hours in buckets of two hours: per bucket,
    per server, in all and its prefill sums, and its lost tokens, as the per-server hour rollups."""
    for template in viewer.templates(Template.objects.all()):
        found = selectors.template_requests(
            template_id=template.pk, since=SINCE, until=UNTIL, bucket=7200, ttft="client", viewer=viewer
        )
        rows = _seen(HourRollup.objects.filter(template=template, hour__gte=SINCE, hour__lt=UNTIL),
                     viewer, loss=False)  # fmt: skip
        sums = {name: Sum(name) for name in (*TOTALS, "prefill_count", "prefill_cross_sum")}
        total = {name: value or 0 for name, value in rows.aggregate(**sums).items()}
        assert vars_of(found.totals) == {name: total[name] for name in TOTALS}
        assert (found.prefill.count, found.prefill.xy) == pytest.approx(
            (total["prefill_count"], total["prefill_cross_sum"])
        )
        servers = _summed(rows, "server_id", {name: Sum(name) for name in TOTALS})
        assert {pk: vars_of(totals) for pk, totals in found.servers.items()} == servers
        for start, bucket in found.buckets.items():
            hours = list(rows.filter(hour__gte=start, hour__lt=start + 2 * HOUR))
            assert bucket.requests == sum(h.requests for h in hours)
            assert merged([bucket.ttft_sketch]) == merged(h.client_ttft_sketch for h in hours)
        losses = selectors.template_losses(
            template_id=template.pk, since=SINCE, until=UNTIL, bucket=7200, viewer=viewer
        )
        seen = _seen(LossHour.objects.filter(template=template, hour__gte=SINCE, hour__lt=UNTIL),
                     viewer, loss=True)  # fmt: skip
        lost = seen.aggregate(**{c: Sum(column) for c, column in LOST_COLUMNS.items()})
        assert losses.get(None, dict.fromkeys(LOST_COLUMNS, 0)) == {c: v or 0 for c, v in lost.items()}


def test_a_tenant_never_reads_the_sum_of_a_shared_template(stored: list[RequestRecord]) -> None:
    """The shared template's hours summed over servers hold other tenants' servers' requests: acme
    sees those of its own server alone, fewer than the sum (so that the test above tells them apart)."""
    shared = Template.objects.get(tenant="")
    acme = Viewer(frozenset({"acme"}))
    found = selectors.template_totals(template_id=shared.pk, since=SINCE, until=UNTIL, viewer=acme)
    summed = TemplateRequestHour.objects.filter(template=shared, hour__gte=SINCE, hour__lt=UNTIL)
    everyone = summed.aggregate(requests=Sum("requests"))["requests"]
    own = HourRollup.objects.filter(
        Q(server__tenant="acme"), template=shared, hour__gte=SINCE, hour__lt=UNTIL
    ).aggregate(requests=Sum("requests"))["requests"]
    assert 0 < found.requests == own < everyone
    assert selectors.template_totals(template_id=shared.pk, since=SINCE, until=UNTIL).requests == everyone
    # Globex's template is not acme's to see: none of its rows, not even those of acme's server.
    globex = Template.objects.get(tenant="globex")
    assert HourRollup.objects.filter(server__tenant="acme", template=globex).exists()
    assert (
        selectors.template_totals(template_id=globex.pk, since=SINCE, until=UNTIL, viewer=acme).requests == 0
    )
    assert SEES_ALL.template_request_hours_sql()[1] is None  # admins: the sums alone
