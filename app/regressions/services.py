"""Regressions opened, updated and resolved from the per-minute rollups, once a minute.

Each run reads the last PREFIXSCOPE_REGRESSION_WINDOW_MINUTES of diagnosed minutes (the last in part) of every
template, template on a server, template for a tenant, server, tenant and of the fleet (a server's,
a tenant's and the fleet's without the tokens lost to prompts changing: a template commit is its
template's regression alone). A scope with an active regression has it updated (its rate now, its
cost) and resolved once the rate is back; another is searched for its latest drop
(app/domain/changepoints.py) and attributed (app/regressions/attribution.py): the cause whose share
rose names its kind, and a drop is opened only in the scope its kind belongs to (a template commit on
its template, a capacity cut on its server, a salt rotation on its tenant). A drop is found again run
after run while the window holds it: one within CHANGE_TOLERANCE of a regression the scope already
had is that regression.

Narrower template scopes. A template on one server (a canary) or for one tenant (a tenant's
variant) opens a template commit's regression of its own only when the template as a whole holds
none: the template scope is searched first in each run, and a narrower drop within CHANGE_TOLERANCE
of a regression of its template is that regression (it has more requests, so it is found no later).
A canary diluted below the template's minimum drop opens on its server's template scope alone; one
whose template fell by a minimum drop over the same minutes is left to the template, which may be a
minute later to be sure (its minutes mix more servers' and tenants' rates: more scatter). The
two narrower kinds defer to each other the same way, tenants first (HIT_RATE_SCOPES says why): one
change is one regression, in the widest scope where it is material. Their suspects are the versions
that took over their own requests (a canary's version is a small share of the template's).

Routing changes. A server's or the fleet's drop whose misses rose as `routed_elsewhere` or `evicted`
is a routing change when the router stopped sending each template's requests of each tenant to the
servers it sent them to before (app/regressions/attribution.py placement(), from the loss rollups'
requests per server; the figures are kept in the regression's evidence), and is opened on the fleet,
searched before its servers: a server's is the fleet's when the fleet fell by a minimum drop over
the same minutes (a router serves the whole fleet), and its own only when it fell alone.

The fleet's drop of no named cause (kind unknown) is opened only for what its servers' own open
regressions do not account for: the fleet less their traffic must still fall by a minimum drop
(`_held_by_servers`), so that a memory cut paged on its server does not page the platform again as
the fleet's.

TTFT p90, the second metric, from the request rollups' histograms (the request rollups have no
tenant: server, template, template on a server, fleet). vLLM's own TTFT where a scope's window has
more of it than of the client's (app/regressions/series.py ttft_series says why), in points of at
least TTFT_PER_POINT TTFTs (thin minutes pooled), searched by changepoints.latest_rise. A rise is
the prefix cache's doing, not opened, when the scope's misses rose across it (app/regressions/ttft.py
says how much): the hit rate places it, as a canary's or a tenant's drop, where a p90, a tail that a
few more misses move, would name the template or server around it. Nor is one opened where a
regression of either metric whose traffic overlaps it (the same template or server, or a wider scope
of them) changed within CHANGE_TOLERANCE. A slow server slows its templates and the fleet too: a rise
of a template's or the fleet's is left to a server of theirs that rose with it (it opens once it has
the evidence), and servers are searched first, then templates, templates on a server, the fleet. A
template that dominates a server's traffic and slows everywhere is then its server's (known limit).

Lifecycle. Resolved as `recovered` once its recent figure is back within half its minimum change;
as `reverted` once a commit that restores the text before its suspect version takes most of its
scope's recent requests (the cause is gone, whatever the cache still has to warm); as `idle` once
its scope has had no traffic in the whole window: nothing is lost while nothing is sent, and an
alert that can never clear is noise. An idle one is opened again if its scope comes back still
regressed (its rate before is out of the window by then, so no new drop would be found).
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from app.domain.changepoints import DetectionConfig, RateChange, latest_drop, measured_from
from app.regressions import attribution, cost, deploys, evidence, hooks, series, ttft
from app.regressions.lifecycle import (
    CHANGE_TOLERANCE,
    DETECTED_FIELDS,
    RECENT_MINUTES,
    Window,
    config_of,
    current,
    key_of,
    of_scope,
    reopen,
    resolution_of,
    resolve,
    resolve_idle,
    resolve_saved,
    same_drop,
    saved,
    suspect_of,
    suspects_of,
    window_of,
)
from app.regressions.models import Regression
from app.regressions.series import NARROW_SCOPES, TEMPLATE_SCOPES, Minute, ScopeKey

logger = logging.getLogger(__name__)

Scope, Metric, Resolution = Regression.Scope, Regression.Metric, Regression.Resolution
# The template first: a narrower template scope's drop is its template's when it has one; then a
# tenant's (prefix-aware routing pins a tenant's variant to a few servers, while a canary server
# takes every tenant's requests: it shows in no one tenant's).
# The fleet before its servers: a routing change of the whole fleet is the fleet's, not each server's.
HIT_RATE_SCOPES = (
    Scope.TEMPLATE, Scope.TEMPLATE_TENANT, Scope.TEMPLATE_SERVER, Scope.FLEET, Scope.SERVER, Scope.TENANT,
)  # fmt: skip


def detect_regressions(*, now: datetime) -> int:
    """One run of the detection (see the module's docstring); returns the regressions opened."""
    window = window_of(now)
    # The deploys first: a version's own test is surer and sooner than the per-minute search.
    opened, seen, templates = check_deploys(now=now), set[ScopeKey](), dict[int | None, list[Minute]]()
    fleet: list[Minute] = []
    for scope in HIT_RATE_SCOPES:
        for key, minutes in series.scope_series(scope, since=window.since, until=window.until).items():
            seen.add(key)
            if scope == Scope.TEMPLATE:
                templates[key[1]] = minutes
            fleet = minutes if scope == Scope.FLEET else fleet
            wider = fleet if scope == Scope.SERVER else templates.get(key[1], [])
            regression = current(key, Metric.HIT_RATE, window)
            if regression is not None and not regression.is_active and _rate_still_low(regression, minutes):
                reopen(regression)
            if regression is not None and regression.is_active:
                _update(regression, minutes, window, now=now)
            else:
                opened += _open(key, minutes, window, wider, now=now) is not None
    resolve_idle(Metric.HIT_RATE, seen, window, now=now)
    evidence.fill_pairs(since=window.since, now=now)
    return opened + ttft.detect_ttft(window, now=now)


def _open(
    key: ScopeKey, minutes: list[Minute], window: Window, wider: list[Minute], *, now: datetime
) -> Regression | None:
    """A drop (see the module's docstring); `wider`: the minutes of a narrower scope's template, or
    of the fleet for a server's."""
    config = config_of(key)
    change = latest_drop([minute.point for minute in minutes], config)
    if change is None:
        return None
    change = _from_stable_segment(key, minutes, change, config)
    if not change.is_regression or change.confidence < config.min_confidence:
        return None
    before, after = minutes[: change.index], minutes[change.index :]
    if key[0] in NARROW_SCOPES and _wider_moved(wider, before, after, config):
        return None
    candidates = suspects_of(key, change.minute, window)
    suspect = suspect_of(candidates)
    if same_drop(key, Metric.HIT_RATE, change.minute, suspect) or (
        key[0] in NARROW_SCOPES and _held_by_wider(key, change.minute, suspect)
    ):
        return None
    found = _attributed(key, change, before, after, window, candidates)
    if found is None or (
        found.kind == Regression.Kind.ROUTING
        and key[0] == Scope.SERVER
        and _wider_moved(wider, before, after, config)
    ):
        return None  # a router that changed for the whole fleet: the fleet's regression
    if (
        found.kind == Regression.Kind.UNKNOWN
        and key[0] == Scope.FLEET
        and _held_by_servers(before, after, window, config)
    ):
        return None  # its servers' regressions, each paged to its owner already
    return _create(key, change, found, after, window, method=_method(config, change), now=now)


def check_deploys(*, now: datetime) -> int:
    """The deploy check (app/regressions/deploys.py): each version that went live lately against
    the version before it, and a revert that took the traffic resolving its regression; returns the
    regressions opened. Beat runs it between detection runs."""
    window, opened = window_of(now), 0
    for version, live_at in deploys.recent_deploys(now=now).items():
        reverted = deploys.reverted_regression(version, live_at=live_at, now=now)
        if reverted is not None:
            resolve_saved(reverted, Resolution.REVERTED, now=now)
        found = deploys.deploy_change(version, live_at=live_at, now=now)
        if found is None:
            continue
        if found.reverted is not None:
            resolve_saved(found.reverted, Resolution.REVERTED, now=now)
        change, key = found.change, (Scope.TEMPLATE, version.template_id, None, "")
        minutes = series.scope_series(Scope.TEMPLATE, since=window.since, until=window.until).get(key, [])
        before = [minute for minute in minutes if minute.minute < change.minute]
        after = [minute for minute in minutes if minute.minute >= change.minute]
        candidates = deploys.suspects_with(
            version, suspects_of(key, change.minute, window), changed_at=change.minute
        )
        attributed = _Attribution(
            Regression.Kind.TEMPLATE_COMMIT, attribution.cause_shift(before, after), candidates, None
        )
        method = {**_method(config_of(key), change), **deploys.METHOD}
        opened += _create(key, change, attributed, after, window, method=method, now=now) is not None
    return opened


def _create(
    key: ScopeKey,
    change: RateChange,
    found: "_Attribution",
    after: list[Minute],
    window: Window,
    *,
    method: dict[str, object],
    now: datetime,
) -> Regression | None:
    """The regression of a drop saved with its cost and evidence; None when another run opened it."""
    scope, template_id, server_id, tenant = key
    kind, shift, candidates = found.kind, found.shift, found.candidates
    regression = Regression(
        scope=scope, template_id=template_id, server_id=server_id, tenant=tenant, changed_at=change.minute,
        detected_at=now, updated_at=now, rate_before=change.rate_before, rate_after=change.rate_after,
        rate_now=change.rate_after, requests_before=change.requests_before,
        requests_after=change.requests_after, confidence=change.confidence, method=method,
        kind=kind, expected=kind in attribution.EXPECTED_KINDS, candidates=candidates, cause_shift=shift,
        suspect_version_id=suspect_of(candidates),
    )  # fmt: skip
    _cost(regression, after, window)
    if scope in TEMPLATE_SCOPES and template_id is not None:
        pair = evidence.before_after_pair(
            template_id, changed_at=change.minute, now=now, version_id=regression.suspect_version_id
        )
        regression.evidence = {"pair": pair}
    if kind == Regression.Kind.ROUTING:
        regression.evidence = {"routing": found.placed}
    return saved(regression)


def _from_stable_segment(
    key: ScopeKey, minutes: list[Minute], change: RateChange, config: DetectionConfig
) -> RateChange:
    """The change measured against the stable segment before it: from the end of the scope's last
    regression before it, when that left the evidence (its minutes are no stable rate to compare
    with: a drop, a revert and a drop again would read the first drop's minutes as "before")."""
    ended = (
        of_scope(key, Metric.HIT_RATE)
        .filter(resolved_at__isnull=False, resolved_at__lt=change.minute)
        .order_by("-resolved_at")
        .values_list("resolved_at", flat=True)
        .first()
    )
    if ended is None:
        return change
    start = next((i for i, minute in enumerate(minutes) if minute.minute >= ended), change.index)
    stable = measured_from([minute.point for minute in minutes], change, start=start, config=config)
    return stable if stable.enough_evidence else change


def _wider_moved(
    wider: list[Minute], before: list[Minute], after: list[Minute], config: DetectionConfig
) -> bool:
    """Whether the wider scope (a narrower scope's template, a server's fleet) fell by a minimum drop
    over the scope's minutes before and after its change: then it is the wider scope's to open (its
    series, mixing more tenants' or servers' rates, may be a minute later to be sure of it)."""
    start, split = before[0].minute, after[0].minute
    earlier = [minute for minute in wider if start <= minute.minute < split]
    later = [minute for minute in wider if split <= minute.minute <= after[-1].minute]
    return bool(earlier and later) and _rate(earlier) - _rate(later) >= config.min_drop


def _held_by_wider(key: ScopeKey, changed_at: datetime, suspect: int | None) -> bool:
    """Whether the template as a whole, or another of its narrower scopes searched before this one,
    has a regression of the same drop (lifecycle.same_drop's rule, across the template's scopes)."""
    near = (changed_at - CHANGE_TOLERANCE, changed_at + CHANGE_TOLERANCE)
    same_template: dict[str, Any] = {"template_id": key[1]}
    held = Regression.objects.filter(
        scope__in=TEMPLATE_SCOPES, metric=Metric.HIT_RATE, changed_at__range=near, **same_template
    ).exclude(pk__in=of_scope(key, Metric.HIT_RATE).values("pk"))
    return any(regression.is_active or regression.suspect_version_id == suspect for regression in held)


def _held_by_servers(
    before: list[Minute], after: list[Minute], window: Window, config: DetectionConfig
) -> bool:
    """Whether a fleet's drop of no named cause is its servers' regressions: the fleet less the
    traffic of the servers with an active regression (in the same definition: server series leave
    out what the fleet's does) did not fall by a minimum drop. The recorded demo's fleet paged the
    platform again, eleven minutes on, for a drop made of a memory cut and a template fault already
    paged to their owners: a fleet regression is for what no narrower one names."""
    regressed = set(
        Regression.objects.filter(scope=Scope.SERVER, metric=Metric.HIT_RATE, server__isnull=False)
        .exclude(state=Regression.State.RESOLVED)
        .values_list("server_id", flat=True)
    )
    if not regressed:
        return False
    servers = series.scope_series(Scope.SERVER, since=window.since, until=window.until)
    theirs: dict[datetime, Minute] = {}
    for (_, _, server, _), minutes in servers.items():
        if server in regressed:
            for minute in minutes:
                theirs[minute.minute] = series.added(theirs.get(minute.minute), minute)
    rest_before = [series.less(minute, theirs.get(minute.minute)) for minute in before]
    rest_after = [series.less(minute, theirs.get(minute.minute)) for minute in after]
    rest_before = [minute for minute in rest_before if minute.prompt_tokens > 0]
    rest_after = [minute for minute in rest_after if minute.prompt_tokens > 0]
    if not (rest_before and rest_after):
        return True  # the regressed servers were all of it
    return _rate(rest_before) - _rate(rest_after) < config.min_drop


@dataclass(frozen=True, slots=True)
class _Attribution:
    kind: Regression.Kind
    shift: dict[str, dict[str, float]]
    candidates: list[dict[str, Any]]
    placed: dict[str, float] | None  # a server's or the fleet's routing figures, when read


def _attributed(
    key: ScopeKey,
    change: RateChange,
    before: list[Minute],
    after: list[Minute],
    window: Window,
    candidates: list[dict[str, Any]],
) -> _Attribution | None:
    """The drop's kind, cause shift, suspects and routing figures; None when it is not this scope's
    to open (another scope's kind, or a cause whose change did not happen)."""
    shift = attribution.cause_shift(before, after)
    placed = None
    if attribution.may_be_routing(key, shift):
        placed = attribution.placement(
            key, since=before[0].minute, changed_at=change.minute, until=window.until
        )
    kind = attribution.kind_at(key, shift, changed_at=change.minute, placed=placed)
    if candidates and kind in (Regression.Kind.TEMPLATE_COMMIT, Regression.Kind.UNKNOWN):
        kind = Regression.Kind.TEMPLATE_COMMIT
    if kind not in attribution.SCOPE_KINDS[key[0]]:
        return None  # another scope's: a salt rotation is its tenant's, a capacity cut its server's
    if not attribution.confirmed(kind, key, after, changed_at=change.minute, placed=placed):
        return None  # evictions, salt or routing misses without the server, salt or router changing
    return _Attribution(kind, shift, candidates, placed)


def _update(regression: Regression, minutes: list[Minute], window: Window, *, now: datetime) -> None:
    """Its rate now and cost; resolved once the recent rate is back within half a minimum drop of
    the rate before, with the evidence a change needs, or once its suspect is reverted."""
    after = [minute for minute in minutes if minute.minute >= regression.changed_at]
    recent = _settled(regression, minutes)[-RECENT_MINUTES:]
    regression.rate_now = _rate(recent) if recent else regression.rate_now
    regression.requests_after = sum(minute.requests for minute in after)
    regression.cause_shift = attribution.since_change(
        regression.cause_shift, after, changed_at=regression.changed_at
    )
    _cost(regression, after, window)
    regression.updated_at = now
    resolution = resolution_of(
        regression, window, back=_enough(recent) and not _rate_still_low(regression, minutes)
    )
    if resolution is not None:
        resolve(regression, resolution, now=now)
    regression.save(update_fields=DETECTED_FIELDS)
    hooks.regression_updated(regression, now=now)


def _rate_still_low(regression: Regression, minutes: Sequence[Minute]) -> bool:
    """Whether the scope's recent rate is below half a minimum drop under the rate before; False
    without the evidence to say (too few requests lately)."""
    recent = _settled(regression, minutes)[-RECENT_MINUTES:]
    recovered = regression.rate_before - config_of(key_of(regression)).min_drop / 2
    return _enough(recent) and _rate(recent) < recovered


def _settled(regression: Regression, minutes: Sequence[Minute]) -> list[Minute]:
    """The minutes after the change's own: that one may hold requests from before it (a deploy
    inside a minute: the deploy check places the change at the minute its first request came in),
    and would read as recovered the moment it opened."""
    return [minute for minute in minutes if minute.minute > regression.changed_at]


def _enough(recent: Sequence[Minute]) -> bool:
    return sum(minute.requests for minute in recent) >= settings.PREFIXSCOPE_REGRESSION_MIN_REQUESTS


def _rate(minutes: Sequence[Minute]) -> float:
    prompt = sum(minute.prompt_tokens for minute in minutes)
    return sum(minute.reused_tokens for minute in minutes) / prompt if prompt else 0.0


def _cost(regression: Regression, after: Sequence[Minute], window: Window) -> None:
    """Its scope's cost since its change (the last hour at most), as every page prices a scope and
    window (app/regressions/cost.py)."""
    cost.price(regression, summed_until=window.until)


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
