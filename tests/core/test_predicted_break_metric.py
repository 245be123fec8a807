"""prefixscope_template_versions_predicted_to_break: versions whose check (made at import) predicts
fewer reusable blocks, counted once requests name them (the PredictedCacheBreakLive alert's series)."""

from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from app.dashboard.metrics.traffic import start_of_day
from app.prompts.models import Template, TemplateVersion, VersionCheck
from app.prompts.services import template_version_seen
from app.traffic.models import LossHour, LossMinute
from tests.core.test_own_metrics import samples
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db
FAMILY = "prefixscope_template_versions_predicted_to_break"


def a_checked_version(template: Template, sha: str, *, head_blocks: int, at: datetime) -> TemplateVersion:
    """A version imported and checked: its prefix goes from 24 blocks to ``head_blocks``."""
    version = TemplateVersion.objects.create(
        template=template, commit_sha=sha, committed_at=at, imported_at=at
    )
    VersionCheck.objects.create(
        version=version, base_sha="0" * 40, checked_at=at, block_size=16, base_blocks=24,
        head_blocks=head_blocks, verdict="failed" if head_blocks < 24 else "passed",
    )  # fmt: skip
    return version


def breaking(client: Client) -> dict[str, float]:
    return {
        dict(labels)["template"]: value for (name, labels), value in samples(client).items() if name == FAMILY
    }


def test_a_break_version_counts_once_requests_name_it(client: Client) -> None:
    now = timezone.now()
    support = Template.objects.create(name="support")
    server = a_server()
    LossHour.objects.create(  # support is among the top templates of the day: its own label
        server=server, template=support, hour=start_of_day(now), requests=10, diagnosed=10,
        diagnosed_prompt_tokens=5000,
    )  # fmt: skip
    broken = a_checked_version(support, "a" * 40, head_blocks=0, at=now - timedelta(minutes=5))
    a_checked_version(support, "b" * 40, head_blocks=24, at=now - timedelta(minutes=5))

    assert breaking(client) == {}  # predicted to break, but no request named it yet

    template_version_seen(template="support", version="b" * 40, tenant="", seen_at=now)
    assert breaking(client) == {}  # a version that keeps its prefix is not counted

    template_version_seen(template="support", version=broken.commit_sha, tenant="", seen_at=now)
    assert breaking(client) == {"support": 1.0}


def test_a_break_version_still_diagnosed_counts_and_one_gone_quiet_does_not(client: Client) -> None:
    now = timezone.now()
    server = a_server()
    support = Template.objects.create(name="support")
    agent = Template.objects.create(name="agent")
    hours_ago = now - timedelta(hours=3)
    for template, sha in ((support, "c" * 40), (agent, "d" * 40)):
        version = a_checked_version(template, sha, head_blocks=5, at=hours_ago)
        TemplateVersion.objects.filter(pk=version.pk).update(first_seen_at=hours_ago)
    # support's version is still diagnosed this minute; agent's last request was hours ago. Neither
    # template has loss hours today: both are past the top N, summed under `other`.
    LossMinute.objects.create(
        server=server, template=support, template_version=TemplateVersion.objects.get(commit_sha="c" * 40),
        minute=now.replace(second=0, microsecond=0), requests=3, diagnosed=3,
    )  # fmt: skip

    assert breaking(client) == {"other": 1.0}
