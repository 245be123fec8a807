"""A version's observed effect, from minute rollup rows inserted here: the template's reused tokens per
request over the hour before it went live minus over the window after it, times its requests an hour
after; the window after ends where the next version went live; too little traffic says nothing; a
viewer reads only the rows of its tenants."""

from datetime import UTC, datetime, timedelta

import pytest

from app.core.tenancy import Viewer
from app.diagnosis.observed import Live, observed_effects
from app.fleet.models import Server
from app.prompts.models import Template, TemplateVersion
from app.traffic.models import MinuteRollup
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db

LIVE = datetime(2026, 3, 2, 10, 0, 30, tzinfo=UTC)  # mid-minute: the minute counts as after
NOW = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)


def _version(template: Template, sha: str) -> TemplateVersion:
    return TemplateVersion.objects.create(template=template, commit_sha=sha, committed_at=LIVE)


def _minutes(
    server: Server, template: Template, first: datetime, count: int, *, requests: int, cached: int
) -> None:
    """`count` minutes from `first`, each of `requests` requests of 1,000 prompt tokens, `cached` of
    them reused per request."""
    for i in range(count):
        MinuteRollup.objects.create(
            server=server, template=template, minute=first + timedelta(minutes=i), requests=requests,
            prompt_tokens=1000 * requests, cached_tokens=cached * requests,
            cache_known_prompt_tokens=1000 * requests,
        )  # fmt: skip


def test_the_effect_is_reuse_lost_per_request_times_requests_an_hour_after() -> None:
    server, template = a_server(name="vllm-a"), Template.objects.create(name="support")
    version = _version(template, "b" * 40)
    start = LIVE.replace(second=0)
    _minutes(server, template, start - timedelta(minutes=60), 60, requests=2, cached=800)
    _minutes(server, template, start, 30, requests=3, cached=200)
    _minutes(server, template, start - timedelta(minutes=90), 30, requests=5, cached=0)  # before the hour

    found = observed_effects(template_id=template.pk, lives=[Live(version.pk, LIVE)], now=NOW)

    observed = found[version.pk]
    assert (observed.before.sums.requests, observed.after.sums.requests) == (120, 90)
    assert observed.before.reused_per_request == 800
    assert observed.after.reused_per_request == 200
    # 90 requests over the hour after: 600 tokens each reused no more.
    assert observed.tokens_per_hour == pytest.approx(600 * 90)


def test_the_window_after_ends_where_the_next_version_went_live_and_the_next_starts_there() -> None:
    server, template = a_server(name="vllm-a"), Template.objects.create(name="support")
    one, two = _version(template, "1" * 40), _version(template, "2" * 40)
    start = LIVE.replace(second=0)
    _minutes(server, template, start - timedelta(minutes=60), 60, requests=2, cached=800)
    _minutes(server, template, start, 20, requests=2, cached=200)  # one
    _minutes(server, template, start + timedelta(minutes=20), 40, requests=4, cached=500)  # two
    lives = [Live(two.pk, LIVE + timedelta(minutes=20)), Live(one.pk, LIVE)]

    found = observed_effects(template_id=template.pk, lives=lives, now=NOW)

    assert found[one.pk].after.until == start + timedelta(minutes=20)
    assert found[one.pk].tokens_per_hour == pytest.approx(600 * 40 * 3)  # 40 requests in 20 minutes
    assert found[two.pk].before.since == start  # one's traffic, not the one before it
    assert found[two.pk].tokens_per_hour == pytest.approx(-300 * 160)  # gained; 160 in the hour after


def test_too_little_traffic_on_either_side_or_no_cached_tokens_says_nothing() -> None:
    server, template = a_server(name="vllm-a"), Template.objects.create(name="support")
    version = _version(template, "b" * 40)
    start = LIVE.replace(second=0)
    _minutes(server, template, start - timedelta(minutes=9), 9, requests=1, cached=800)  # 9 requests
    _minutes(server, template, start, 30, requests=3, cached=200)

    observed = observed_effects(template_id=template.pk, lives=[Live(version.pk, LIVE)], now=NOW)[version.pk]

    assert observed.before.reused_per_request is None and observed.tokens_per_hour is None
    unknown = MinuteRollup.objects.filter(minute__lt=start)
    unknown.update(requests=30, cache_known_prompt_tokens=0)
    observed = observed_effects(template_id=template.pk, lives=[Live(version.pk, LIVE)], now=NOW)[version.pk]
    assert observed.before.sums.requests == 270 and observed.tokens_per_hour is None


def test_an_effect_still_under_way_counts_its_whole_minutes_and_one_just_live_is_absent() -> None:
    server, template = a_server(name="vllm-a"), Template.objects.create(name="support")
    version = _version(template, "b" * 40)
    start = LIVE.replace(second=0)
    _minutes(server, template, start - timedelta(minutes=60), 60, requests=2, cached=800)
    _minutes(server, template, start, 16, requests=3, cached=200)  # the 16th minute is under way
    lives = [Live(version.pk, LIVE)]

    observed = observed_effects(template_id=template.pk, lives=lives, now=LIVE + timedelta(minutes=15))

    assert observed[version.pk].after.sums.requests == 45
    assert observed[version.pk].tokens_per_hour == pytest.approx(600 * 45 * 4)
    assert observed_effects(template_id=template.pk, lives=lives, now=LIVE) == {}


def test_a_viewer_reads_the_effect_of_its_own_servers_traffic_only() -> None:
    template = Template.objects.create(name="support")
    ours, theirs = a_server(name="vllm-a", tenant="acme"), a_server(name="vllm-g", tenant="globex")
    version = _version(template, "b" * 40)
    start = LIVE.replace(second=0)
    for server, after in ((ours, 200), (theirs, 800)):  # globex's traffic lost nothing
        _minutes(server, template, start - timedelta(minutes=60), 60, requests=2, cached=800)
        _minutes(server, template, start, 60, requests=2, cached=after)
    lives = [Live(version.pk, LIVE)]

    acme = observed_effects(template_id=template.pk, lives=lives, now=NOW, viewer=Viewer(frozenset({"acme"})))
    every = observed_effects(template_id=template.pk, lives=lives, now=NOW)
    nobody = observed_effects(template_id=template.pk, lives=lives, now=NOW, viewer=Viewer(frozenset()))

    assert acme[version.pk].tokens_per_hour == pytest.approx(600 * 120)
    assert every[version.pk].tokens_per_hour == pytest.approx(300 * 240)
    assert nobody[version.pk].before.sums.requests == 0 and nobody[version.pk].tokens_per_hour is None
