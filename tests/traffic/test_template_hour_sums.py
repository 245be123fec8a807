"""The hour rollups summed per template (TemplateRequestHour) and per template and tenant
(TemplateLossHour) equal the raw records and diagnoses summed apart; and what the Templates list and a
template's page read through them is, for every viewer, what the per-server hour rollups it sees
(app/core/tenancy.py rollups() and traffic()) of the templates it sees sum to."""

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db.models import Q, Sum

from app.core.tenancy import SEES_ALL, SEES_NOTHING, Viewer
from app.dashboard.reads import templates as selectors
from app.domain.hitrate import RequestSums
from app.domain.sketch import merged
from app.prompts.models import Template
from app.rollups.visibility import visible, visible_sums_sql
from app.traffic.models import (
    LOST_COLUMNS,
    HourRollup,
    LossHour,
    RequestRecord,
    TemplateRequestHour,
)
from tests.traffic import test_server_hour_sums as server_sums

pytestmark = pytest.mark.django_db

START, VIEWERS = server_sums.START, server_sums.VIEWERS
stored = server_sums.stored  # records of three servers, four templates (one none), four tenants
HOUR = timedelta(hours=1)
SINCE, UNTIL = START + 5 * HOUR, START + 11 * HOUR  # the window; the one before it from START - HOUR
TOTALS = ("requests", "prompt_tokens", "cached_tokens", "cache_known_prompt_tokens")


def _hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def _seen(rows: Any, viewer: Viewer, *, loss: bool) -> Any:
    """The per-server rows of some template the viewer sees, of the templates it sees."""
    seen = viewer.traffic(rows) if loss else visible(viewer, rows)
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
            pk: RequestSums(**totals) for pk, totals in expected.items()
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


def vars_of(totals: RequestSums) -> dict[str, int]:
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
    sums, rest = visible_sums_sql(SEES_ALL, TemplateRequestHour, HourRollup)
    assert (sums.sql, rest.sql) == ("true", "false")  # admins: the sums alone
