"""The lifecycle the detection gives a regression, whatever its metric (app/regressions/services.py
and ttft.py, split out of services.py by size): its scope's window and configuration, opening it
once, resolving it (recovered, reverted, idle) and opening it again when its idle scope comes back
regressed. Writers, as services are."""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from app.domain.changepoints import DetectionConfig
from app.prompts.models import Template
from app.regressions import attribution, hooks, selectors, series
from app.regressions.models import Regression
from app.regressions.series import TEMPLATE_SCOPES, ScopeKey

logger = logging.getLogger(__name__)

Scope, Resolution = Regression.Scope, Regression.Resolution
CHANGE_TOLERANCE = timedelta(minutes=10)
RECENT_MINUTES = 5  # a regression's figure now: over its scope's last minutes with traffic
# A revert has taken the traffic when it has most of the scope's requests of its last minutes with
# traffic: the commit says what it is, the traffic only that it is live, so two minutes are enough.
REVERT_MINUTES = 2
# What a detection run changes on a regression it updates: never its evidence (the webhook's task
# and the killers' freezing write their keys into it meanwhile) nor a person's note.
DETECTED_FIELDS = [
    field.name
    for field in Regression._meta.concrete_fields
    if field.name not in ("id", "evidence", "note", "noted_by")
]


@dataclass(frozen=True, slots=True)
class Window:
    since: datetime
    until: datetime  # as far as the diagnosis has summed: the last minute read in part


def window_of(now: datetime) -> Window:
    """Up to what the diagnosis has summed: it diagnoses what arrived up to its delay ago, so the
    last minute is read in part (fewer requests, the same rate; the next run reads it whole). Whole
    minutes only would read a minute at the earliest a minute and the delay after it ends: a run
    just after the minute (as beat's may be) would wait a cycle more for every drop."""
    until = now - timedelta(seconds=settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS)
    since = until.replace(second=0, microsecond=0)
    return Window(since - timedelta(minutes=settings.PREFIXSCOPE_REGRESSION_WINDOW_MINUTES), until)


def current(key: ScopeKey, metric: str, window: Window) -> Regression | None:
    """The scope's active regression, or its latest if it was resolved while the scope was idle (to
    be opened again if the scope came back regressed); None when a new one may be searched for. A
    scope has one active at most and a new one changed after the one before (CHANGE_TOLERANCE).
    Those that changed after the window are not seen: a backfill over history run again looks at
    moments before them."""
    earlier = of_scope(key, metric).filter(changed_at__lt=window.until)
    latest = earlier.order_by("-changed_at").first()
    if latest is None or latest.is_active or latest.resolution == Resolution.IDLE:
        return latest
    return None


def reopen(regression: Regression) -> None:
    """A regression resolved while its scope was idle, whose scope came back no better: open again."""
    regression.state, regression.resolved_at, regression.resolution = Regression.State.OPEN, None, ""
    logger.info("regression open again: %s", summary(regression), extra={"regression": regression.pk})


def same_drop(key: ScopeKey, metric: str, changed_at: datetime, suspect: int | None) -> bool:
    """Whether a drop found at `changed_at` is one the scope already has a regression of: one that
    changed within CHANGE_TOLERANCE of it and is still active or has the same suspect. A resolved
    one with another suspect is another drop (a bad deploy, its revert, a second bad deploy minutes
    later: two regressions); the detection finds a drop again run after run while the window holds
    it, and its suspect stays the same."""
    near = of_scope(key, metric).filter(
        changed_at__range=(changed_at - CHANGE_TOLERANCE, changed_at + CHANGE_TOLERANCE)
    )
    return any(regression.is_active or regression.suspect_version_id == suspect for regression in near)


def of_scope(key: ScopeKey, metric: str) -> QuerySet[Regression]:
    scope, template_id, server_id, tenant = key
    fields: dict[str, Any] = {"template_id": template_id, "server_id": server_id, "tenant": tenant}
    return Regression.objects.filter(scope=scope, metric=metric, **fields)


def config_of(key: ScopeKey) -> DetectionConfig:
    min_drop = settings.PREFIXSCOPE_REGRESSION_MIN_DROP
    if key[1] is not None and key[0] in TEMPLATE_SCOPES:
        own = Template.objects.filter(pk=key[1]).values_list("regression_min_drop", flat=True).first()
        min_drop = own if own is not None else min_drop
    return DetectionConfig(
        min_drop=min_drop,
        min_confidence=settings.PREFIXSCOPE_REGRESSION_MIN_CONFIDENCE,
        min_requests_before=settings.PREFIXSCOPE_REGRESSION_MIN_REQUESTS,
        min_requests_after=settings.PREFIXSCOPE_REGRESSION_MIN_REQUESTS,
        # One whole minute after the change may be enough (its requests are the evidence): a
        # second would cost every regression a detection cycle.
        min_segment_points=1,
    )


def suspect_of(candidates: list[dict[str, Any]]) -> int | None:
    best = candidates[0] if candidates else None
    return best["version_id"] if best and best["gain"] >= attribution.SUSPECT_MIN_GAIN else None


def saved(regression: Regression) -> Regression | None:
    """The new regression saved, its killers frozen and the webhook told; None when a redelivered
    or concurrent run opened it first (it is one regression)."""
    try:
        with transaction.atomic():
            regression.save()
    except IntegrityError:
        return None
    hooks.regression_opened(regression, now=regression.detected_at)
    extra = {
        "regression": regression.pk,
        "scope": regression.scope,
        "metric": regression.metric,
        "kind": regression.kind,
        "changed_at": regression.changed_at.isoformat(),
    }
    logger.info("regression opened: %s", summary(regression), extra=extra)
    return regression


def summary(regression: Regression) -> str:
    """What a log line says of a regression at a glance: "template support: 95% -> 29%, Template
    commit, suspect 1a2b3c4 (support: show the time at the top)" (make run's console shows these
    lines, app/devconsole.py)."""
    suspect = regression.suspect_version
    subject = suspect.message.splitlines()[0][:80] if suspect is not None and suspect.message else ""
    named = f", suspect {suspect.commit_sha[:7]}" if suspect is not None else ""
    named += f" ({subject})" if subject else ""
    return f"{regression}, {regression.kind_label}{named}"


def suspects_of(key: ScopeKey, changed_at: datetime, window: Window) -> list[dict[str, Any]]:
    """A template scope's suspect versions, from its own requests (a canary's server, a tenant's)."""
    scope, template_id, server_id, tenant = key
    if scope not in TEMPLATE_SCOPES or template_id is None:
        return []
    return attribution.suspects(
        template_id, changed_at=changed_at, since=window.since, until=window.until, server_id=server_id,
        tenant=tenant if scope == Scope.TEMPLATE_TENANT else None,
    )  # fmt: skip


def resolve(regression: Regression, resolution: str, *, now: datetime) -> None:
    """Resolved (the caller saves it), saying why: a Regression.Resolution."""
    regression.state, regression.resolved_at = Regression.State.RESOLVED, now
    regression.resolution = resolution
    extra = {"regression": regression.pk, "resolution": resolution}
    logger.info("regression resolved (%s): %s", resolution, summary(regression), extra=extra)


def resolve_idle(metric: str, seen: set[ScopeKey], window: Window, *, now: datetime) -> None:
    """Resolve the metric's active regressions whose scope had no minute in the window (of those
    that changed before its end, as `current` sees them)."""
    active = Regression.objects.filter(metric=metric, changed_at__lt=window.until)
    active = active.exclude(state=Regression.State.RESOLVED)
    for regression in active:
        if key_of(regression) not in seen:
            resolve_saved(regression, Resolution.IDLE, now=now)


def resolve_saved(regression: Regression, resolution: str, *, now: datetime) -> None:
    """Resolved (as `resolve`), saved, and the webhook told."""
    resolve(regression, resolution, now=now)
    regression.updated_at = now
    regression.save(update_fields=["state", "resolved_at", "resolution", "updated_at"])
    hooks.regression_resolved(regression, now=now)


def resolution_of(regression: Regression, window: Window, *, back: bool) -> str | None:
    """How an active regression ends now, if it does: reverted once a commit restoring the text
    before its suspect took most of the scope's requests of its last REVERT_MINUTES minutes with
    traffic, or once its figure is `back` while such a commit serves any of them (the revert brought
    it back: a revert live for a minute between two bad deploys never holds most of two minutes);
    recovered when back without one; None while it lasts."""
    share = revert_share(regression, window)
    if share > 0.5 or (back and share > 0):
        return Resolution.REVERTED
    return Resolution.RECOVERED if back else None


def revert_share(regression: Regression, window: Window) -> float:
    """The share of the scope's requests of its last REVERT_MINUTES minutes with traffic that went
    to commits restoring the text before the suspect (0 without a suspect or such a commit)."""
    if regression.suspect_version is None or regression.template_id is None:
        return 0.0
    reverts = selectors.reverts_of(regression.suspect_version)
    if not reverts:
        return 0.0
    per_version = series.version_requests(
        regression.template_id, since=window.since, until=window.until, server_id=regression.server_id,
        tenant=regression.tenant if regression.scope == Scope.TEMPLATE_TENANT else None,
    )  # fmt: skip
    minutes = sorted({minute for rows in per_version.values() for minute, _ in rows})[-REVERT_MINUTES:]
    if not minutes:
        return 0.0
    recent = {
        version: sum(n for minute, n in rows if minute >= minutes[0]) for version, rows in per_version.items()
    }
    return sum(recent.get(version, 0) for version in reverts) / (sum(recent.values()) or 1)


def key_of(regression: Regression) -> ScopeKey:
    return (regression.scope, regression.template_id, regression.server_id, regression.tenant)
