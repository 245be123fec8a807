"""The deploy check: each template version that went live lately, against the version before it.

Every PREFIXSCOPE_DEPLOY_CHECK_SECONDS (beat), and first in each detection run, each version with
a deploy marker (from the deploy API, or its first request) in the last DEPLOY_HORIZON is tested
(app/domain/deploys.py): its requests since it went live against those of the version that served
the template just before it, read from the request records and their diagnoses as they are
written (a few hundred rows by the template's index: no wait for the minute's rollup, which is what
makes it faster than the per-minute search). Each request weighs its reusable prompt tokens, as the
template's per-minute series does: a version whose questions are longer is no drop. A material
drop, sure at the detection's confidence, opens the template's regression with that version as its
suspect, changed at the minute of its first request.

Not tested: a version whose text restores an earlier good version's (a revert, or a re-deploy of
a known-good text: it cannot be a drop's suspect), one that is already a regression's suspect on
the template, a template with an active regression (that one is updated) unless the version before
this one reverted its suspect (then that one is resolved as reverted when this one opens), and a
version that has not taken most of the template's requests since it went live (a canary: the
per-minute search opens it on its server's scope, where it is material).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Max, QuerySet

from app.domain.changepoints import RateChange
from app.domain.deploys import DeployTest, RequestReuse, version_change
from app.prompts.models import DeployMarker, TemplateVersion
from app.regressions import attribution
from app.regressions.attribution import restores_good_text
from app.regressions.lifecycle import config_of, of_scope
from app.regressions.models import Regression
from app.regressions.selectors import reverts_of
from app.regressions.series import ScopeKey
from app.traffic.models import NEVER_REUSABLE, RequestDiagnosis, RequestRecord

DEPLOY_HORIZON = timedelta(minutes=15)  # how long after going live a version is tested
BEFORE = timedelta(minutes=30)  # the version before it: its requests of this long before, and since
MAX_REQUESTS = 2000  # of each version: far more than the test needs, and a bound on the read
METHOD = {
    "method": "deploy check: the version's warm requests against the version's before it",
    "rate_cost": "token-weighted rates, ratio estimators' standard errors (delta method)",
    "confidence": "one-sided z, Bonferroni over the looks at one deploy",
}
"""What a regression opened by the deploy check says of its method (over the detection's parameters)."""


def recent_deploys(*, now: datetime) -> dict[TemplateVersion, datetime]:
    """Each version that went live in the DEPLOY_HORIZON before `now`, with when: its latest deploy
    marker up to `now` (a re-deploy moves it)."""
    markers = (
        DeployMarker.objects.filter(deployed_at__gte=now - DEPLOY_HORIZON, deployed_at__lte=now)
        .values("template_version")
        .annotate(live_at=Max("deployed_at"))
    )
    live = {row["template_version"]: row["live_at"] for row in markers}
    versions = TemplateVersion.objects.in_bulk(list(live))
    return {version: live[pk] for pk, version in versions.items()}


@dataclass(frozen=True, slots=True)
class DeployDrop:
    """A deployed version's drop, and the template's active regression its opening resolves: the
    one whose suspect the version before it reverted (a bad deploy, its revert, a bad deploy again
    before the detection saw the revert take the traffic)."""

    change: RateChange
    reverted: Regression | None


def deploy_change(version: TemplateVersion, *, live_at: datetime, now: datetime) -> DeployDrop | None:
    """The version's drop against the version before it, when it is one to test (module docstring)
    and the test finds a regression at the detection's confidence; else None."""
    key: ScopeKey = (Regression.Scope.TEMPLATE, version.template_id, None, "")
    regressions = of_scope(key, Regression.Metric.HIT_RATE)
    if restores_good_text(version) or regressions.filter(suspect_version=version).exists():
        return None
    records = RequestRecord.objects.filter(
        template_id=version.template_id,
        arrived_at__gte=live_at - BEFORE,
        arrived_at__lt=now,
        cached_tokens__isnull=False,
        prompt_tokens__gt=0,
    )
    taken = records.filter(template_version=version, arrived_at__gte=live_at)
    previous = _version_before(records, version, live_at)
    if previous is None or not _took_over(records, live_at, taken.count()):
        return None
    active = regressions.exclude(state=Regression.State.RESOLVED).select_related("suspect_version").first()
    if active is not None and not _reverted_by(active, previous):
        return None  # still regressed: that regression is updated, not doubled
    before, after = _reuse(records.filter(template_version_id=previous)), _reuse(taken)
    config = config_of(key)
    test = DeployTest(min_requests=settings.PREFIXSCOPE_DEPLOY_MIN_REQUESTS, looks=_looks())
    change = version_change(before, after, config, test)
    if change is None or not change.is_regression or change.confidence < config.min_confidence:
        return None
    return DeployDrop(change, active)


def _looks() -> int:
    """How many times one deploy is tested: every check over its horizon."""
    return max(1, int(DEPLOY_HORIZON.total_seconds() // settings.PREFIXSCOPE_DEPLOY_CHECK_SECONDS))


def reverted_regression(version: TemplateVersion, *, live_at: datetime, now: datetime) -> Regression | None:
    """The template's active regression that `version` reverts (it restores the text before the
    regression's suspect) once it has taken most of the template's requests since it went live,
    DeployTest's minimum of them at least: the cause is gone, whatever the cache still has to warm.
    Sooner than the per-minute rule (lifecycle.resolution_of: diagnosed minutes), and sure of it."""
    key: ScopeKey = (Regression.Scope.TEMPLATE, version.template_id, None, "")
    regressions = of_scope(key, Regression.Metric.HIT_RATE).exclude(state=Regression.State.RESOLVED)
    active = regressions.select_related("suspect_version").first()
    if active is None or not _reverted_by(active, version.pk):
        return None
    since = RequestRecord.objects.filter(
        template_id=version.template_id, arrived_at__gte=live_at, arrived_at__lt=now
    )
    taken = since.filter(template_version=version).count()
    enough = taken >= settings.PREFIXSCOPE_DEPLOY_MIN_REQUESTS
    return active if enough and _took_over(since, live_at, taken) else None


def _reverted_by(regression: Regression, version_id: int) -> bool:
    suspect = regression.suspect_version
    return suspect is not None and version_id in reverts_of(suspect)


def _version_before(
    records: QuerySet[RequestRecord], version: TemplateVersion, live_at: datetime
) -> int | None:
    """The version of the template's last request before `version` went live (another version)."""
    earlier = records.filter(arrived_at__lt=live_at, template_version__isnull=False)
    earlier = earlier.exclude(template_version=version).order_by("-arrived_at")
    found: int | None = earlier.values_list("template_version_id", flat=True).first()
    return found


def _took_over(records: QuerySet[RequestRecord], live_at: datetime, taken: int) -> bool:
    """Whether `taken` requests are most of the template's since the version went live."""
    return taken * 2 > records.filter(arrived_at__gte=live_at).count()


def _reuse(records: QuerySet[RequestRecord]) -> list[RequestReuse]:
    """The diagnosed ones of the records, each with its reusable prompt tokens and what of them
    was reused (the template's per-minute series' figures: app/regressions/series.py LEFT_OUT)."""
    rows = list(
        records.order_by("arrived_at").values_list("arrived_at", "server_id", "request_id", "salt_hash")[
            :MAX_REQUESTS
        ]
    )
    reuse = _diagnosed_reuse(rows)
    found = []
    for arrived_at, server_id, request_id, salt in rows:
        reusable, reused = reuse.get((server_id, request_id, arrived_at), (0, 0))
        if reusable > 0:  # not yet diagnosed, or nothing in it was reusable
            found.append(RequestReuse(arrived_at, (server_id, salt), reusable, min(reused, reusable)))
    return found


def _diagnosed_reuse(
    rows: list[tuple[datetime, int, str, str]],
) -> dict[tuple[int, str, datetime], tuple[int, int]]:
    """(reusable prompt tokens, reused tokens) of each of the records that is diagnosed, by its key;
    a diagnosis that could not say (no cached tokens, a hit counter not wired) says nothing."""
    if not rows:
        return {}
    diagnoses = RequestDiagnosis.objects.filter(
        server_id__in={row[1] for row in rows},
        arrived_at__gte=rows[0][0],
        arrived_at__lte=rows[-1][0],
        request_id__in=[row[2] for row in rows],
        unknown="",
    ).annotate(reusable_=F("prompt_tokens") - NEVER_REUSABLE)
    return {
        (server_id, request_id, arrived_at): (reusable, reused)
        for server_id, request_id, arrived_at, reusable, reused in diagnoses.values_list(
            "server_id", "request_id", "arrived_at", "reusable_", "reused_tokens"
        )
    }


def suspects_with(
    version: TemplateVersion, candidates: list[dict[str, Any]], *, changed_at: datetime
) -> list[dict[str, Any]]:
    """The per-minute search's candidates with the deployed version first: it is the suspect."""
    own = next((c for c in candidates if c["version_id"] == version.pk), None)
    own = own or attribution.candidate(version, gain=1.0, changed_at=changed_at)
    return [
        {**own, "gain": max(own["gain"], attribution.SUSPECT_MIN_GAIN)},
        *(c for c in candidates if c is not own),
    ]
