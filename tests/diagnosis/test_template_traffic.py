"""A version's check priced with its template's traffic of the day before the check, from the
request rollups (app/diagnosis/template_traffic.py)."""

from datetime import UTC, datetime, timedelta

import pytest
from pytest_django import Settings

from app.diagnosis.template_traffic import price_version_checks
from app.prompts.models import Template, TemplateVersion, VersionCheck
from app.traffic.models import HourRollup, MinuteRollup
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db
CHECKED_AT = datetime(2026, 3, 2, 12, 30, tzinfo=UTC)


def a_check(name: str = "support", *, base_blocks: int | None = 24, head_blocks: int = 12) -> VersionCheck:
    """A check of block size 16 whose prefix goes from ``base_blocks`` to ``head_blocks``."""
    template = Template.objects.create(name=name)
    version = TemplateVersion.objects.create(
        template=template, commit_sha="a" * 40, committed_at=CHECKED_AT, imported_at=CHECKED_AT
    )
    return VersionCheck.objects.create(
        version=version, base_sha="b" * 40 if base_blocks is not None else "", checked_at=CHECKED_AT,
        verdict="failed", block_size=16, base_blocks=base_blocks, head_blocks=head_blocks,
        base_stable_tokens=None if base_blocks is None else base_blocks * 16 + 3,
        head_stable_tokens=head_blocks * 16 + 3, departs_at_token=head_blocks * 16 + 1,
    )  # fmt: skip


def test_a_check_is_priced_with_the_day_before_it(settings: Settings) -> None:
    settings.PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND = 2000
    settings.PREFIXSCOPE_GPU_HOUR_PRICE = 3.6
    check = a_check()
    server = a_server()
    template = check.version.template
    # The template's first traffic of the day: the hour from 07:00 (a whole hour: the hour rollups).
    HourRollup.objects.create(
        server=server, template=template, hour=CHECKED_AT.replace(hour=7, minute=0), requests=600,
        prompt_tokens=300_000, cached_tokens=60_000, cache_known_prompt_tokens=300_000,
    )  # fmt: skip
    # The last hour: 60 requests of 500 tokens, 60 % of them reused (half are cache-known).
    MinuteRollup.objects.create(
        server=server, template=template, minute=CHECKED_AT - timedelta(minutes=10), requests=60,
        prompt_tokens=30_000, cached_tokens=9_000, cache_known_prompt_tokens=15_000,
    )  # fmt: skip
    # After the check, and another template's: neither counts.
    MinuteRollup.objects.create(
        server=server, template=template, minute=CHECKED_AT + timedelta(minutes=1), requests=999,
        prompt_tokens=999, cached_tokens=0, cache_known_prompt_tokens=999,
    )  # fmt: skip

    assert price_version_checks(version_ids=[check.version_id], now=CHECKED_AT + timedelta(minutes=2)) == 1

    check.refresh_from_db()
    requests_per_hour = 660 / 5.5  # from 07:00 to 12:30
    reused = 0.6 * 500  # the last hour's hit rate x its prompt tokens per request
    after = reused / (24 * 16) * (12 * 16)  # the same share of the shorter prefix
    tokens = (reused - after) * requests_per_hour
    assert check.requests_per_hour == pytest.approx(requests_per_hour)
    assert check.reused_tokens_before == pytest.approx(reused)
    assert check.reused_tokens_after == pytest.approx(after)
    assert check.predicted_tokens_per_hour == pytest.approx(tokens)
    assert check.predicted_gpu_seconds_per_hour == pytest.approx(tokens / 2000)
    assert check.predicted_cost_per_hour == pytest.approx(tokens / 2000 / 3600 * 3.6)
    assert check.priced_at == CHECKED_AT + timedelta(minutes=2)


def test_with_no_hour_of_traffic_the_day_says_what_is_reused() -> None:
    check = a_check()
    HourRollup.objects.create(
        server=a_server(), template=check.version.template, hour=CHECKED_AT - timedelta(hours=6, minutes=30),
        requests=100, prompt_tokens=50_000, cached_tokens=10_000, cache_known_prompt_tokens=50_000,
    )  # fmt: skip

    price_version_checks(version_ids=[check.version_id], now=CHECKED_AT)

    check.refresh_from_db()
    assert check.reused_tokens_before == pytest.approx(100)
    assert check.requests_per_hour == pytest.approx(100 / 6.5)


@pytest.mark.parametrize("base_blocks", [24, None], ids=["no traffic", "first version"])
def test_a_check_without_traffic_or_base_is_priced_with_no_price(base_blocks: int | None) -> None:
    check = a_check(base_blocks=base_blocks)
    if base_blocks is None:  # traffic there is, but nothing to compare with
        MinuteRollup.objects.create(
            server=a_server(), template=check.version.template, minute=CHECKED_AT - timedelta(minutes=5),
            requests=10, prompt_tokens=5000, cached_tokens=1000, cache_known_prompt_tokens=5000,
        )  # fmt: skip

    assert price_version_checks(version_ids=[check.version_id], now=CHECKED_AT) == 0

    check.refresh_from_db()
    assert check.priced_at == CHECKED_AT
    assert (check.requests_per_hour, check.predicted_tokens_per_hour, check.predicted_cost_per_hour) == (
        None,
        None,
        None,
    )


def test_a_priced_check_is_not_priced_again() -> None:
    check = a_check()
    price_version_checks(version_ids=[check.version_id], now=CHECKED_AT)
    MinuteRollup.objects.create(
        server=a_server(), template=check.version.template, minute=CHECKED_AT - timedelta(minutes=5),
        requests=10, prompt_tokens=5000, cached_tokens=1000, cache_known_prompt_tokens=5000,
    )  # fmt: skip

    assert price_version_checks(version_ids=[check.version_id], now=CHECKED_AT + timedelta(hours=1)) == 0
    check.refresh_from_db()
    assert (check.priced_at, check.predicted_tokens_per_hour) == (CHECKED_AT, None)
