"""Where a scope's prefix-cache hit rate (or TTFT p90) changed, by how much, and how surely.

The input is a scope's per-minute rollups without its idle minutes: the series is indexed by points,
not wall minutes, so idle gaps cost nothing, and evidence is counted in requests. ruptures' PELT
(Killick, Fearnhead and Eckley, JASA 2012: the exact penalised segmentation, pruned) proposes the
changes, with a penalty of `penalty_factor * ln(points)` each (BIC's for a rate and a location).

Hit rate: the cost is a binomial deviance whose trials are requests, not tokens (a request's tokens
hit or miss together: whole blocks, whole prompts); a minute of n requests at token-weighted rate r
is n trials and n * r successes. Requests of one minute share a cache state, so minutes scatter more
than a binomial says: Williams' overdispersion model (Applied Statistics 31, 1982) counts them as
n / (1 + (n - 1) * rho) trials, with rho fitted by moments on the Pearson statistics of adjacent
minutes, each clipped at 9 (3 sigma), robustly: a change spoils the pair across it (both pairs
around a minute it falls inside), and on a short history those pairs would pass for scatter (two
minutes before a drop: three pairs, one across it, rho 0.25, and 118 requests a minute counted as
four trials). So a start first: the mean of the smallest pairs, all but the two largest (two at
least), matched to its expectation for chi-squared(1) draws (the order statistics' integral), so
that it stays unbiased on scatter alone; then the pairs beyond 25 (5 sigma) at the start's rho are
changes and are left out, and the mean of the others is matched to E[min(X, 9) | X < 25], again
until the pairs left out no longer change. Without a pair that far out, as on fault-free traffic,
this is the plain clipped mean over all pairs. rho = 0, a binomial over requests, is the floor
(rates in [0, 1] vary no more than a Bernoulli's), so minutes with more requests never weigh more
than their scatter allows.

A test then disposes: a change's neighbouring segments' deviance as one rate minus as two is a
likelihood ratio, chi-squared(1) for a fixed split; its p-value is multiplied by the n(n - 1)/2
segments the series admits (Bonferroni), since the split and its neighbours were both searched for.
Changes below `min_confidence` are dropped, weakest first, each drop re-testing its neighbours over
the joined segments. Two changes the same way a minute apart are one, inside that minute (it holds
both rates); its figures are the segments either side. A regression is a drop that is material
(`min_drop`) with `min_requests_before` and `_after` on its sides. TTFT: log p90 over its von
Neumann noise scale, so that an l2 cost is a unit-variance Gaussian deviance; the same search and
test. Deterministic, so that a backfill over history finds what the online check found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from itertools import pairwise
from operator import attrgetter

import numpy as np
import ruptures

from app.domain.segments import (
    CLIP,
    OUTLIER,
    TRIMMED,
    FloatArray,
    SegmentCost,
    binomial_cost,
    confidence,
    dispersion,
    gaussian_deviance,
    likelihood_ratio,
)

_MIN_LOG_SIGMA = 0.01  # a 1% floor: a flat TTFT series would otherwise make every wobble a change


@dataclass(frozen=True, slots=True)
class MinutePoint:
    """One minute of a scope's traffic, from the rollups."""

    minute: datetime
    requests: int
    prompt_tokens: int
    reused_tokens: int


@dataclass(frozen=True, slots=True)
class DetectionConfig:
    """When a change counts; configurable per template, recorded on each regression."""

    min_drop: float = 0.15  # hit rate before minus after, absolute
    # Below it a change is no change (0 keeps all PELT finds); the service tests every minute over
    # overlapping windows, so 0.999 rather than 0.99: no false change in 2,300 simulated fault-free
    # series, while a collapse is still found at its 50th request.
    min_confidence: float = 0.999
    min_requests_before: int = 50
    min_requests_after: int = 50
    penalty_factor: float = 2.0  # PELT's penalty per change is this times ln(points)
    min_segment_points: int = 2  # one odd minute is not a segment
    # PELT tries every n-th point, the refinement then places each change exactly: 5 is 25 times
    # faster on long series (O(points^2 / jump^2) when nothing changes), and may be a minute late.
    search_jump: int = 1
    min_ttft_ratio: float = 1.5  # p90 after over before
    min_ttft_points: int = 10  # minutes on each side of a TTFT change

    def parameters(self) -> dict[str, object]:
        """The method and its parameters, JSON-able, to store with what it found."""
        return {
            "method": f"ruptures {ruptures.__version__} Pelt, then each split refined and tested",
            "rate_cost": "binomial deviance over requests, Williams overdispersion",
            "dispersion": (
                f"adjacent minutes' Pearson statistics clipped at {CLIP:g}: a start without the "
                f"{TRIMMED} largest, then without those beyond {OUTLIER:g}, each mean matched to "
                "its chi-squared(1) expectation"
            ),
            "ttft_cost": "l2 on log p90 over its von Neumann scale",
            "confidence": "likelihood ratio, chi-squared(1), Bonferroni over n(n-1)/2 segments",
            **asdict(self),
        }


@dataclass(frozen=True, slots=True)
class RateChange:
    """A change in the hit rate, with the segments on either side of it."""

    index: int  # of the first point after the change
    minute: datetime  # of that point
    rate_before: float  # token-weighted
    rate_after: float
    requests_before: int
    requests_after: int
    prompt_tokens_before: int
    prompt_tokens_after: int
    drop: float  # rate_before - rate_after: negative for a rise
    statistic: float  # likelihood ratio, overdispersion allowed for
    dispersion: float  # Williams' rho of the whole series
    confidence: float  # 1 - the Bonferroni-corrected p-value, at least min_confidence
    material: bool  # drop >= min_drop
    enough_evidence: bool  # min_requests_before and _after

    @property
    def is_regression(self) -> bool:
        return self.drop > 0 and self.material and self.enough_evidence


@dataclass(frozen=True, slots=True)
class LevelChange:
    """A change in TTFT p90, with the segments on either side of it."""

    index: int
    minute: datetime
    before: float  # geometric mean of the p90 seconds: a log-normal's median
    after: float
    ratio: float  # after / before
    points_before: int
    points_after: int
    statistic: float
    confidence: float
    material: bool  # ratio >= min_ttft_ratio
    enough_evidence: bool  # min_ttft_points on both sides

    @property
    def is_regression(self) -> bool:
        return self.ratio > 1 and self.material and self.enough_evidence


@dataclass(frozen=True, slots=True)
class _Split:
    """A change between its neighbouring changes (or the series' ends), and its test."""

    start: int
    index: int
    end: int
    statistic: float
    confidence: float


def rate_changes(points: Sequence[MinutePoint], config: DetectionConfig) -> list[RateChange]:
    """Every change in the hit rate that PELT finds and the test confirms, oldest first.

    Raises ValueError unless minutes strictly increase, every point has a request and a prompt
    token, and 0 <= reused <= prompt tokens. A series too short to split has none.
    """
    _check_points(points)
    if len(points) < 2 * config.min_segment_points:
        return []
    requests = np.array([point.requests for point in points], dtype=np.float64)
    rates = np.array([point.reused_tokens / point.prompt_tokens for point in points])
    rho = dispersion(requests, rates)
    cost = binomial_cost(requests, rates, rho)
    splits = _confirmed(cost, _proposed(cost, config), config)
    return _merged([_rate_change(points, split, rho, config) for split in splits], config)


def _merged(changes: list[RateChange], config: DetectionConfig) -> list[RateChange]:
    """Two changes the same way a minute apart are one, inside that minute: a change within a
    minute leaves it between both rates, a segment of its own. The change is that minute; its
    figures are the segments either side of it, its confidence the lower."""
    found: list[RateChange] = []
    for change in changes:
        last = found[-1] if found else None
        if last is None or change.index - last.index != 1 or (change.drop > 0) != (last.drop > 0):
            found.append(change)
            continue
        drop = last.rate_before - change.rate_after
        found[-1] = replace(
            last, rate_after=change.rate_after, requests_after=change.requests_after,
            prompt_tokens_after=change.prompt_tokens_after, drop=drop,
            statistic=min(last.statistic, change.statistic),
            confidence=min(last.confidence, change.confidence),
            material=drop >= config.min_drop,
            enough_evidence=last.requests_before >= config.min_requests_before
            and change.requests_after >= config.min_requests_after,
        )  # fmt: skip
    return found


def latest_drop(points: Sequence[MinutePoint], config: DetectionConfig) -> RateChange | None:
    """The most recent change that is a regression (a material drop with the evidence), if any.

    A drop that has since recovered is still returned: it happened, and a backfill must agree.
    """
    drops = [change for change in rate_changes(points, config) if change.is_regression]
    return drops[-1] if drops else None


def measured_from(
    points: Sequence[MinutePoint], change: RateChange, *, start: int, config: DetectionConfig
) -> RateChange:
    """The change with its before segment from point `start` (a stable segment the caller knows of:
    not the minutes of an earlier drop) and its confidence tested again over it."""
    start = min(max(start, 0), change.index - 1)
    before = points[start : change.index]
    end = change.index + sum(1 for _ in _after_points(points, change))
    requests = np.array([point.requests for point in points], dtype=np.float64)
    rates = np.array([point.reused_tokens / point.prompt_tokens for point in points])
    cost = binomial_cost(requests, rates, change.dispersion)
    split = _test(cost, (start, change.index, end), len(points))
    rate_before = _token_rate(before)
    requests_before = sum(point.requests for point in before)
    return replace(
        change, rate_before=rate_before, requests_before=requests_before,
        prompt_tokens_before=sum(point.prompt_tokens for point in before),
        drop=rate_before - change.rate_after,
        statistic=split.statistic, confidence=split.confidence,
        material=rate_before - change.rate_after >= config.min_drop,
        enough_evidence=requests_before >= config.min_requests_before
        and change.requests_after >= config.min_requests_after,
    )  # fmt: skip


def _after_points(points: Sequence[MinutePoint], change: RateChange) -> Sequence[MinutePoint]:
    """The points of the change's after segment (its requests counted from the change on)."""
    total, found = 0, []
    for point in points[change.index :]:
        if total >= change.requests_after:
            break
        found.append(point)
        total += point.requests
    return found


def level_changes(values: Sequence[tuple[datetime, float]], config: DetectionConfig) -> list[LevelChange]:
    """Every change in a per-minute TTFT p90 (seconds) that PELT finds and the test confirms.

    Raises ValueError unless minutes strictly increase and every value is positive.
    """
    _check_order([minute for minute, _ in values])
    if any(not value > 0 for _, value in values):
        raise ValueError("TTFT p90 values must be positive")
    if len(values) < 2 * config.min_segment_points:
        return []
    logs = np.log(np.array([value for _, value in values], dtype=np.float64))
    # von Neumann's mean squared successive difference: a step barely moves it, heavy tails do.
    scale = max(math.sqrt(float(np.mean(np.diff(logs) ** 2)) / 2.0), _MIN_LOG_SIGMA)
    signal = np.column_stack((logs / scale, (logs / scale) ** 2))
    cost = SegmentCost(gaussian_deviance).fit(signal)
    splits = _confirmed(cost, _proposed(cost, config), config)
    return [_level_change(values, logs, split, config) for split in splits]


def latest_rise(values: Sequence[tuple[datetime, float]], config: DetectionConfig) -> LevelChange | None:
    """The most recent TTFT change that is a regression (a material rise with the evidence)."""
    rises = [change for change in level_changes(values, config) if change.is_regression]
    return rises[-1] if rises else None


def _proposed(cost: SegmentCost, config: DetectionConfig) -> list[int]:
    """PELT's changes (the index of each first point after one), each placed exactly."""
    points = len(cost.signal)
    search = ruptures.Pelt(custom_cost=cost, min_size=config.min_segment_points, jump=config.search_jump)
    penalty = config.penalty_factor * math.log(points)
    return _refined(cost, [int(end) for end in search.fit(cost.signal).predict(pen=penalty)])


def _confirmed(cost: SegmentCost, indices: list[int], config: DetectionConfig) -> list[_Split]:
    """The proposed changes that the test confirms, each tested against its neighbours.

    The weakest goes first and its neighbours are tested again over the segments it joins, so that
    an unconfirmed wobble next to a drop does not cut the drop's evidence short.
    """
    points = len(cost.signal)
    indices = list(indices)
    while True:
        bounds = [0, *indices, points]
        splits = [
            _test(cost, bound, points) for bound in zip(bounds[:-2], bounds[1:-1], bounds[2:], strict=True)
        ]
        weakest = min(splits, key=attrgetter("confidence"), default=None)
        if weakest is None or weakest.confidence >= config.min_confidence:
            return splits
        indices.remove(weakest.index)


def _refined(cost: SegmentCost, ends: list[int]) -> list[int]:
    """PELT's splits, each moved to the best between its neighbours with one point a side at least.

    PELT keeps `min_segment_points` a side; one is let in here, so that a drop is placed right when
    one minute (of enough requests) has arrived after it.
    """
    indices: list[int] = []
    for end in ends[1:]:
        start = indices[-1] if indices else 0
        indices.append(
            max(range(start + 1, end), key=lambda index: likelihood_ratio(cost, start, index, end))
        )
    return indices


def _test(cost: SegmentCost, bounds: tuple[int, int, int], points: int) -> _Split:
    start, index, end = bounds
    statistic = likelihood_ratio(cost, start, index, end)
    # The split and the ends of its segments were searched for: count every segment the series admits.
    return _Split(start, index, end, statistic, confidence(statistic, tries=points * (points - 1) // 2))


def _rate_change(
    points: Sequence[MinutePoint], split: _Split, rho: float, config: DetectionConfig
) -> RateChange:
    before, after = points[split.start : split.index], points[split.index : split.end]
    rate_before, rate_after = _token_rate(before), _token_rate(after)
    requests_before, requests_after = sum(p.requests for p in before), sum(p.requests for p in after)
    return RateChange(
        index=split.index,
        minute=after[0].minute,
        rate_before=rate_before,
        rate_after=rate_after,
        requests_before=requests_before,
        requests_after=requests_after,
        prompt_tokens_before=sum(p.prompt_tokens for p in before),
        prompt_tokens_after=sum(p.prompt_tokens for p in after),
        drop=rate_before - rate_after,
        statistic=split.statistic,
        dispersion=rho,
        confidence=split.confidence,
        material=rate_before - rate_after >= config.min_drop,
        enough_evidence=requests_before >= config.min_requests_before
        and requests_after >= config.min_requests_after,
    )


def _level_change(
    values: Sequence[tuple[datetime, float]], logs: FloatArray, split: _Split, config: DetectionConfig
) -> LevelChange:
    before = math.exp(float(logs[split.start : split.index].mean()))
    after = math.exp(float(logs[split.index : split.end].mean()))
    points_before, points_after = split.index - split.start, split.end - split.index
    return LevelChange(
        index=split.index,
        minute=values[split.index][0],
        before=before,
        after=after,
        ratio=after / before,
        points_before=points_before,
        points_after=points_after,
        statistic=split.statistic,
        confidence=split.confidence,
        material=after / before >= config.min_ttft_ratio,
        enough_evidence=min(points_before, points_after) >= config.min_ttft_points,
    )


def _token_rate(points: Sequence[MinutePoint]) -> float:
    return sum(p.reused_tokens for p in points) / sum(p.prompt_tokens for p in points)


def _check_points(points: Sequence[MinutePoint]) -> None:
    _check_order([point.minute for point in points])
    for point in points:
        if point.requests < 1 or point.prompt_tokens < 1:
            raise ValueError(f"a point needs a request and a prompt token: {point}")
        if not 0 <= point.reused_tokens <= point.prompt_tokens:
            raise ValueError(f"reused tokens must be within 0 and the prompt tokens: {point}")


def _check_order(minutes: Sequence[datetime]) -> None:
    for prev, curr in pairwise(minutes):
        if curr <= prev:
            raise ValueError(f"minutes must increase: {curr} after {prev}")
