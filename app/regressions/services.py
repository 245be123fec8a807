"""Regressions opened, updated and resolved from the per-minute loss rollups, once a minute.

Each run reads the last PREFIXSCOPE_REGRESSION_WINDOW_MINUTES of whole, diagnosed minutes of every
template, server, tenant and of the fleet (a server's, a tenant's and the fleet's without the tokens
lost to prompts changing: a template commit is its template's regression alone). A scope with an
active regression has it updated (its rate now, its cost) and resolved once the rate is back; another
is searched for its latest drop (app/domain/changepoints.py) and attributed
(app/regressions/attribution.py): the cause whose share rose names its kind, and a drop is opened
only in the scope its kind belongs to (a template commit on its template, a capacity cut on its
server, a salt rotation on its tenant). A drop is found again run after run while the window holds
it: one within CHANGE_TOLERANCE of a regression the scope already had is that regression.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from app.domain.changepoints import DetectionConfig, RateChange, latest_drop
from app.domain.prefill import prefill_tokens_per_second
from app.prompts.models import Template
from app.regressions import attribution, evidence, series
from app.regressions.models import Regression
from app.regressions.series import Minute, ScopeKey, scope_series

logger = logging.getLogger(__name__)

Scope = Regression.Scope
CHANGE_TOLERANCE = timedelta(minutes=10)
RECENT_MINUTES = 5  # a regression's rate now: over its scope's last minutes with traffic


@dataclass(frozen=True, slots=True)
class _Window:
    since: datetime
    until: datetime  # as far as the diagnosis has had time to sum: the last minute read in part


def detect_regressions(*, now: datetime) -> int:
    """One run of the detection (see the module's docstring); returns the regressions opened."""
    window = _window(now)
    opened = 0
    for scope in Scope:
        for key, minutes in scope_series(scope, since=window.since, until=window.until).items():
            regression = _active(key)
            if regression is None:
                opened += _open(key, minutes, window, now=now) is not None
            else:
                _update(regression, minutes, window, now=now)
    return opened


def _window(now: datetime) -> _Window:
    """Up to what the diagnosis has summed: it diagnoses what arrived up to its delay ago, so the
    last minute is read in part (fewer requests, the same rate; the next run reads it whole). Whole
    minutes only would read a minute at the earliest a minute and the delay after it ends: a run
    just after the hour (as beat's may be) would wait a cycle more for every drop."""
    until = now - timedelta(seconds=settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS)
    since = until.replace(second=0, microsecond=0)
    return _Window(since - timedelta(minutes=settings.PREFIXSCOPE_REGRESSION_WINDOW_MINUTES), until)


def _active(key: ScopeKey) -> Regression | None:
    return _of_scope(key).exclude(state=Regression.State.RESOLVED).order_by("-changed_at").first()


def _of_scope(key: ScopeKey) -> QuerySet[Regression]:
    scope, template_id, server_id, tenant = key
    fields: dict[str, Any] = {"template_id": template_id, "server_id": server_id, "tenant": tenant}
    return Regression.objects.filter(scope=scope, metric=Regression.Metric.HIT_RATE, **fields)


def _config(key: ScopeKey) -> DetectionConfig:
    min_drop = settings.PREFIXSCOPE_REGRESSION_MIN_DROP
    if key[1] is not None and key[0] == Scope.TEMPLATE:
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


def _open(key: ScopeKey, minutes: list[Minute], window: _Window, *, now: datetime) -> Regression | None:
    config = _config(key)
    change = latest_drop([minute.point for minute in minutes], config)
    if change is None or _of_scope(key).filter(changed_at__gte=change.minute - CHANGE_TOLERANCE).exists():
        return None
    before, after = minutes[: change.index], minutes[change.index :]
    found = _attributed(key, change, before, after, window)
    if found is None:
        return None
    kind, shift, candidates = found
    suspect = candidates[0] if candidates and candidates[0]["gain"] >= attribution.SUSPECT_MIN_GAIN else None
    scope, template_id, server_id, tenant = key
    regression = Regression(
        scope=scope, template_id=template_id, server_id=server_id, tenant=tenant, changed_at=change.minute,
        detected_at=now, updated_at=now, rate_before=change.rate_before, rate_after=change.rate_after,
        rate_now=change.rate_after, requests_before=change.requests_before,
        requests_after=change.requests_after, confidence=change.confidence, method=_method(config, change),
        kind=kind, expected=kind in attribution.EXPECTED_KINDS, candidates=candidates, cause_shift=shift,
        suspect_version_id=suspect["version_id"] if suspect else None,
    )  # fmt: skip
    _cost(regression, after, window)
    if scope == Scope.TEMPLATE and template_id is not None:
        pair = evidence.before_after_pair(
            template_id, changed_at=change.minute, now=now, version_id=regression.suspect_version_id
        )
        regression.evidence = {"pair": pair}
    try:
        with transaction.atomic():
            regression.save()
    except IntegrityError:  # a redelivered or concurrent run opened it first: it is one regression
        return None
    extra = {
        "regression": regression.pk,
        "scope": scope,
        "kind": kind,
        "changed_at": change.minute.isoformat(),
    }
    logger.info("regression opened", extra=extra)
    return regression


def _attributed(
    key: ScopeKey, change: RateChange, before: list[Minute], after: list[Minute], window: _Window
) -> tuple[Regression.Kind, dict[str, dict[str, float]], list[dict[str, Any]]] | None:
    """The drop's kind, cause shift and suspects; None when it is not this scope's to open (another
    scope's kind, or a cause whose change did not happen)."""
    shift = attribution.cause_shift(before, after)
    kind = attribution.kind_at(key, shift, changed_at=change.minute)
    candidates: list[dict[str, Any]] = []
    if key[0] == Scope.TEMPLATE and key[1] is not None:
        candidates = attribution.suspects(
            key[1], changed_at=change.minute, since=window.since, until=window.until
        )
        if candidates and kind in (Regression.Kind.TEMPLATE_COMMIT, Regression.Kind.UNKNOWN):
            kind = Regression.Kind.TEMPLATE_COMMIT
    if kind not in attribution.SCOPE_KINDS[key[0]]:
        return None  # another scope's: a salt rotation is its tenant's, a capacity cut its server's
    if not attribution.confirmed(kind, key, after, changed_at=change.minute):
        return None  # evictions or salt misses without the server or the salt having changed
    return kind, shift, candidates


def _update(regression: Regression, minutes: list[Minute], window: _Window, *, now: datetime) -> None:
    """Its rate now and cost; resolved once the recent rate is back within half a minimum drop of
    the rate before (a recovery, or the version reverted), with the evidence a change needs."""
    after = [minute for minute in minutes if minute.minute >= regression.changed_at]
    recent = after[-RECENT_MINUTES:]
    regression.rate_now = _rate(recent) if recent else regression.rate_now
    regression.requests_after = sum(minute.requests for minute in after)
    _cost(regression, after, window)
    regression.updated_at = now
    recovered = regression.rate_before - _config(_key(regression)).min_drop / 2
    enough = sum(minute.requests for minute in recent) >= settings.PREFIXSCOPE_REGRESSION_MIN_REQUESTS
    if recent and enough and regression.rate_now >= recovered:
        regression.state, regression.resolved_at = Regression.State.RESOLVED, now
        logger.info("regression resolved", extra={"regression": regression.pk})
    regression.save()


def _key(regression: Regression) -> ScopeKey:
    return (regression.scope, regression.template_id, regression.server_id, regression.tenant)


def _rate(minutes: Sequence[Minute]) -> float:
    prompt = sum(minute.prompt_tokens for minute in minutes)
    return sum(minute.reused_tokens for minute in minutes) / prompt if prompt else 0.0


def _cost(regression: Regression, after: Sequence[Minute], window: _Window) -> None:
    """Prefill tokens per hour the lost reuse costs at the traffic since the change; in GPU seconds
    at the prefill rate measured on the scope's requests of the last hour (TTFT over uncached
    tokens, app/domain/prefill.py), else the configured one; money at the configured GPU-hour price."""
    span = len(after) or 1  # minutes with traffic: idle ones cost nothing
    prompt_per_hour = sum(minute.prompt_tokens for minute in after) / span * 60
    lost = max(regression.rate_before - regression.rate_now, 0.0) * prompt_per_hour
    sums = series.prefill_sums(_key(regression), since=window.until - timedelta(hours=1), until=window.until)
    measured = prefill_tokens_per_second(sums)
    rate = measured or settings.PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND
    regression.lost_tokens_per_hour = lost
    regression.prefill_tokens_per_second = rate
    regression.prefill_rate_source = "measured" if measured else "configured"
    regression.gpu_seconds_per_hour = lost / rate
    regression.cost_per_hour = regression.gpu_seconds_per_hour / 3600 * settings.PREFIXSCOPE_GPU_HOUR_PRICE


def _method(config: DetectionConfig, change: RateChange) -> dict[str, object]:
    return {
        **config.parameters(),
        "statistic": round(change.statistic, 3),
        "dispersion": round(change.dispersion, 4),
        "drop": round(change.drop, 4),
    }


def note_regression(regression: Regression, *, state: str, note: str, user: Any, now: datetime) -> Regression:
    """A person acknowledges or mutes a regression (or opens it again), with a note. A resolved one
    stays resolved: the detection closed it, and a note is all that is added."""
    if regression.state != Regression.State.RESOLVED:
        regression.state = state
    regression.note, regression.noted_by, regression.updated_at = note, user, now
    regression.save(update_fields=["state", "note", "noted_by", "updated_at"])
    logger.info("regression noted", extra={"regression": regression.pk, "state": regression.state})
    return regression
