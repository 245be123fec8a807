"""Regressions in sequence: a bad deploy, its revert and a second bad deploy minutes later, each found
by the deploy check (its requests against the version before it) within two minutes of its first
request (its diagnosed requests: a diagnosis waits 30 s for late KV events),
on the demo's traffic stored as a deployment stores it (tests/support/virtual_fleet.py)."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db.models import F, Sum

from app.prompts.models import DeployMarker, TemplateVersion
from app.regressions.attribution import candidate, restores_good_text
from app.regressions.models import Regression
from app.regressions.services import check_deploys, detect_regressions
from app.traffic.models import NEVER_REUSABLE, RequestDiagnosis, RequestRecord
from tests.regressions.test_detection import demo, fault_commit
from tests.support.virtual_fleet import VirtualRun, run_virtually

pytestmark = pytest.mark.django_db(transaction=True)

Resolution, Scope = Regression.Resolution, Regression.Scope
SUPPORT_TEXT = next(t["text"] for t in demo()["templates"] if t["name"] == "support")
BAD_AGAIN = 660  # three minutes after the revert, six after the first bad deploy
TIMELINE: list[dict[str, Any]] = [
    {"at": 300, "template": "support", "change": {"fault": "volatile_top"}},
    {"at": 480, "template": "support", "change": {"message": "Revert the time", "text": SUPPORT_TEXT}},
    {"at": BAD_AGAIN, "template": "support", "change": {"fault": "shuffled_chunks"}},
    {"at": 840, "template": "support", "change": {"message": "Revert the passages", "text": SUPPORT_TEXT}},
]
MAX_DELAY = timedelta(seconds=120)


def checked(tmp_path: Path, duration: int = 1020, *, deploy_check: bool = True) -> VirtualRun:
    """The sequence up to `duration`, with the deploy check every 15 s unless `deploy_check` is off
    (the per-minute search alone)."""
    return run_virtually(
        demo(duration=duration, timeline=[event for event in TIMELINE if event["at"] <= duration]),
        tmp_path,
        every_minute=lambda now: detect_regressions(now=now),
        every_check=(lambda now: check_deploys(now=now)) if deploy_check else None,
    )


def first_request_on(run: VirtualRun, sha: str) -> RequestRecord:
    version = TemplateVersion.objects.get(commit_sha=sha)
    first: RequestRecord = RequestRecord.objects.filter(template_version=version).earliest("arrived_at")
    return first


@pytest.mark.parametrize("deploy_check", [True, False], ids=["deploy-check", "per-minute-search-alone"])
def test_bad_revert_bad_again_opens_two_regressions_each_with_its_suspect(
    tmp_path: Path, deploy_check: bool
) -> None:
    run = checked(tmp_path, deploy_check=deploy_check)

    first, second = Regression.objects.filter(scope=Scope.TEMPLATE, template__name="support").order_by(
        "changed_at"
    )
    for regression, at in ((first, 300), (second, BAD_AGAIN)):
        sha = fault_commit(run, "support", at)
        assert regression.suspect_version is not None and regression.suspect_version.commit_sha == sha
        assert regression.resolution == Resolution.REVERTED
        delay = regression.detected_at - first_request_on(run, sha).arrived_at
        assert timedelta(0) < delay <= (MAX_DELAY if deploy_check else timedelta(minutes=4)), (at, delay)
    # Opened before its first minutes were diagnosed, it names their causes once they are.
    assert first.cause_shift["after"].get("prompt_changed", 0) > 0.5, first.cause_shift
    # Its rate before is the reverted text's, as the good text's was before the first deploy: of
    # the reusable prompt tokens (the template's series' definition), not of all of them.
    good = RequestDiagnosis.objects.filter(
        template__name="support", arrived_at__gte=run.at(60), arrived_at__lt=run.at(300), unknown=""
    ).aggregate(reused=Sum("reused_tokens"), reusable=Sum(F("prompt_tokens") - NEVER_REUSABLE))
    stable = good["reused"] / good["reusable"]
    assert abs(second.rate_before - stable) <= 0.01, (second.rate_before, stable)
    assert Regression.objects.filter(template__name="support").count() == 2  # no narrower duplicates


def test_a_revert_is_never_a_suspect_and_live_at_is_the_latest_deploy_before_the_change(
    tmp_path: Path,
) -> None:
    run = checked(tmp_path, duration=600)
    bad = TemplateVersion.objects.get(commit_sha=fault_commit(run, "support", 300))
    revert = TemplateVersion.objects.get(commit_sha=fault_commit(run, "support", 480))
    assert restores_good_text(revert) and not restores_good_text(bad)
    [regression] = Regression.objects.filter(template__name="support", scope=Scope.TEMPLATE)
    assert revert.pk not in [c["version_id"] for c in regression.candidates]

    # A re-deploy of the bad version after the revert moves when it went live for a later change.
    again = run.at(560)
    DeployMarker.objects.create(template_version=bad, deployed_at=again)
    assert candidate(bad, gain=1.0, changed_at=again + timedelta(minutes=1))["live_at"] == again.isoformat()
    first_live = candidate(bad, gain=1.0, changed_at=run.at(330))["live_at"]
    assert first_live is not None and first_live < again.isoformat()
