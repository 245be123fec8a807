"""TTFT p90 regressions, the detection's second metric (see app/regressions/services.py's docstring
for the method and what a rise defers to); split out of services.py by size. Writers, as services are."""

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from django.conf import settings
from django.db.models import Q

from app.domain.changepoints import DetectionConfig, LevelChange, latest_rise, level_changes
from app.regressions import hooks, series
from app.regressions.lifecycle import (
    CHANGE_TOLERANCE,
    DETECTED_FIELDS,
    Window,
    config_of,
    current,
    key_of,
    of_scope,
    reopen,
    resolution_of,
    resolve,
    resolve_idle,
    saved,
    suspect_of,
    suspects_of,
)
from app.regressions.models import Regression
from app.regressions.series import ScopeKey, TtftMinute, TtftSeries

logger = logging.getLogger(__name__)

Scope, Metric, Resolution = Regression.Scope, Regression.Metric, Regression.Resolution
# A slow server slows its templates and the fleet: servers first.
TTFT_SCOPES = (Scope.SERVER, Scope.TEMPLATE, Scope.TEMPLATE_SERVER, Scope.FLEET)
TTFT_PER_POINT = 10  # TTFTs a point of the TTFT series needs: a p90 of three requests is noise
# Points on each side of a TTFT change, besides MIN_REQUESTS TTFTs: five minutes of a server taking
# a quarter of a small fleet's requests; the domain's default of ten would take a thin scope twenty.
TTFT_MIN_POINTS = 5
MISS_RISE = 1 / 3  # a rise of the cache misses, relative, that explains a TTFT rise


def detect_ttft(window: Window, *, now: datetime) -> int:
    found = series.ttft_series(since=window.since, until=window.until)
    opened = 0
    for scope in TTFT_SCOPES:
        for key, ttfts in found.items():
            if key[0] != scope:
                continue
            regression = current(key, Metric.TTFT, window)
            if (
                regression is not None
                and not regression.is_active
                and _ttft_still_high(regression, ttfts.minutes)
            ):
                reopen(regression)
            if regression is not None and regression.is_active:
                _update_ttft(regression, ttfts.minutes, window, now=now)
            else:
                opened += _open_ttft(key, ttfts, window, found, now=now) is not None
    resolve_idle(Metric.TTFT, set(found), window, now=now)
    return opened


def _open_ttft(
    key: ScopeKey, ttfts: TtftSeries, window: Window, found: dict[ScopeKey, TtftSeries], *, now: datetime
) -> Regression | None:
    """A material, confirmed rise of the scope's TTFT p90 with MIN_REQUESTS TTFTs on each side, that
    the cache does not explain, no server of the scope shares and no regression of overlapping
    traffic holds (see app/regressions/services.py's docstring)."""
    config = _ttft_config(key)
    points = series.pooled(ttfts.minutes, at_least=TTFT_PER_POINT)
    change = latest_rise([(point.minute, point.p90) for point in points], config)
    if change is None:
        return None
    before = points[change.index - change.points_before : change.index]
    after = points[change.index : change.index + change.points_after]
    if not (_enough_ttfts(before) and _enough_ttfts(after)) or _cache_explains(before, after):
        return None
    if _overlapped(key, change.minute) or _a_server_rose(key, change.minute, found):
        return None
    candidates = suspects_of(key, change.minute, window)
    suspect = suspect_of(candidates)
    scope, template_id, server_id, tenant = key
    regression = Regression(
        scope=scope, template_id=template_id, server_id=server_id, tenant=tenant, metric=Metric.TTFT,
        changed_at=change.minute, detected_at=now, updated_at=now, rate_before=_hit_rate(before),
        rate_after=_hit_rate(after), rate_now=_hit_rate(after), requests_before=sum(p.count for p in before),
        requests_after=sum(p.count for p in after), confidence=change.confidence,
        method=_ttft_method(config, change, ttfts.source), ttft_before_seconds=change.before,
        ttft_after_seconds=change.after, ttft_now_seconds=change.after, candidates=candidates,
        kind=Regression.Kind.TEMPLATE_COMMIT if suspect else Regression.Kind.UNKNOWN,
        suspect_version_id=suspect,
    )  # fmt: skip
    return saved(regression)


def _ttft_config(key: ScopeKey) -> DetectionConfig:
    # One odd point is no TTFT level: segments of two points at least.
    return replace(config_of(key), min_segment_points=2, min_ttft_points=TTFT_MIN_POINTS)


def _a_server_rose(key: ScopeKey, changed_at: datetime, found: dict[ScopeKey, TtftSeries]) -> bool:
    """Whether a server whose requests are the scope's (some of them) had a material, confirmed rise
    within CHANGE_TOLERANCE too, with or without its evidence yet: a slow server slows its templates
    and the fleet, and it is the server's to open once it has the evidence (a server with fewer
    requests than its template's has fewer TTFTs to show it with)."""
    scope, template_id, server_id, _ = key
    if scope == Scope.SERVER:
        return False
    for server in {k[2] for k in found if k[0] == Scope.SERVER and server_id in (None, k[2])}:
        if template_id is not None and (Scope.TEMPLATE_SERVER, template_id, server, "") not in found:
            continue  # it serves none of the template's requests
        server_key = (Scope.SERVER, None, server, "")
        points = series.pooled(found[server_key].minutes, at_least=TTFT_PER_POINT)
        config = _ttft_config(server_key)
        rises = level_changes([(point.minute, point.p90) for point in points], config)
        if any(rise.material and abs(rise.minute - changed_at) <= CHANGE_TOLERANCE for rise in rises):
            return True
    return False


def _cache_explains(before: Sequence[TtftMinute], after: Sequence[TtftMinute]) -> bool:
    """Whether more of the scope's prompt tokens missed the prefix cache after the rise: its slower
    prefills are then the cache's doing, which the hit rate places (a canary's server, a tenant's
    template: the hit-rate detection opens it there), not a slower engine. A p90 is a tail that a
    few more missing requests move: a third more misses (and two points) is enough to say so."""
    missed_before, missed_after = 1 - _hit_rate(before), 1 - _hit_rate(after)
    return missed_after - missed_before >= max(missed_before * MISS_RISE, 0.02)


def _overlapped(key: ScopeKey, changed_at: datetime) -> bool:
    """Whether the scope's TTFT rise is already held: by its own regression (this change or a later
    one), or by a regression of either metric, within CHANGE_TOLERANCE, whose traffic overlaps the
    scope's (the same template or server, or a scope wider than either: a tenant's spans them all)."""
    if of_scope(key, Metric.TTFT).filter(changed_at__gte=changed_at - CHANGE_TOLERANCE).exists():
        return True
    _, template_id, server_id, _ = key
    near = Regression.objects.filter(
        changed_at__range=(changed_at - CHANGE_TOLERANCE, changed_at + CHANGE_TOLERANCE)
    )
    if template_id is not None:
        near = near.filter(Q(template_id=template_id) | Q(template__isnull=True))
    if server_id is not None:
        near = near.filter(Q(server_id=server_id) | Q(server__isnull=True))
    return near.exists()


def _update_ttft(regression: Regression, minutes: list[TtftMinute], window: Window, *, now: datetime) -> None:
    """Its p90 now (over the last minutes with MIN_REQUESTS TTFTs); resolved once it is within half a
    minimum rise of the p90 before, or once its suspect is reverted."""
    after = [minute for minute in minutes if minute.minute >= regression.changed_at]
    recent = _recent_ttfts(after)
    regression.requests_after = sum(minute.count for minute in after)
    regression.updated_at = now
    if recent:
        regression.ttft_now_seconds, regression.rate_now = recent[0].p90, _hit_rate(recent)
    resolution = resolution_of(
        regression, window, back=bool(recent) and not _ttft_still_high(regression, minutes)
    )
    if resolution is not None:
        resolve(regression, resolution, now=now)
    regression.save(update_fields=DETECTED_FIELDS)
    hooks.regression_updated(regression, now=now)


def _ttft_still_high(regression: Regression, minutes: Sequence[TtftMinute]) -> bool:
    """Whether the recent p90 is above half a minimum rise over the p90 before; False without the
    evidence to say."""
    recent = _recent_ttfts([minute for minute in minutes if minute.minute >= regression.changed_at])
    back = (regression.ttft_before_seconds or 0.0) * (
        1 + (config_of(key_of(regression)).min_ttft_ratio - 1) / 2
    )
    return bool(recent) and recent[0].p90 > back


def _recent_ttfts(after: Sequence[TtftMinute]) -> list[TtftMinute]:
    """The last minutes with traffic pooled into one point of MIN_REQUESTS TTFTs; [] if too few."""
    pooled = series.pooled(list(reversed(after)), at_least=settings.PREFIXSCOPE_REGRESSION_MIN_REQUESTS)
    return pooled[:1]


def _enough_ttfts(points: Sequence[TtftMinute]) -> bool:
    return sum(point.count for point in points) >= settings.PREFIXSCOPE_REGRESSION_MIN_REQUESTS


def _hit_rate(points: Sequence[TtftMinute]) -> float:
    prompt = sum(point.prompt_tokens for point in points)
    return sum(point.cached_tokens for point in points) / prompt if prompt else 0.0


def _ttft_method(config: DetectionConfig, change: LevelChange, source: str) -> dict[str, object]:
    return {
        **config.parameters(),
        "ttft_source": source,
        "ttft_per_point": TTFT_PER_POINT,
        "min_ttft_points": TTFT_MIN_POINTS,
        "statistic": round(change.statistic, 3),
        "ratio": round(change.ratio, 3),
        "points_before": change.points_before,
        "points_after": change.points_after,
    }
