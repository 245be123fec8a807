"""Where a scope's prefix-cache hit rate (or TTFT p90) changed, by how much, and how surely.

The input is a scope's per-minute rollups without its idle minutes: the series is indexed by points,
not wall minutes, so idle gaps cost nothing, and evidence is counted in requests. ruptures' PELT
(Killick, Fearnhead and Eckley, JASA 2012: the exact penalised segmentation, pruned) proposes the
changes, with a penalty of `penalty_factor * ln(points)` each (BIC's for a rate and a location).

Hit rate: the cost is a binomial deviance whose trials are requests, not tokens (a request's tokens
hit or miss together: whole blocks, whole prompts); a minute of n requests at token-weighted rate r
is n trials and n * r successes. Requests of one minute share a cache state, so minutes scatter more
than a binomial says: Williams' overdispersion model (Applied Statistics 31, 1982) counts them as
n / (1 + (n - 1) * rho) trials, with rho fitted by moments: the Pearson statistics of adjacent
minutes, each clipped at 9 so that a real change (one pair) does not pass for scatter, average as
chi-squared(1)'s would. rho = 0, a binomial over requests, is the floor (rates in [0, 1] vary no
more than a Bernoulli's), so minutes with more requests never weigh more than their scatter allows.

A test then disposes: a change's neighbouring segments' deviance as one rate minus as two is a
likelihood ratio, chi-squared(1) for a fixed split; its p-value is multiplied by the n(n - 1)/2
segments the series admits (Bonferroni), since the split and its neighbours were both searched for.
Changes below `min_confidence` are dropped, weakest first, each drop re-testing its neighbours over
the joined segments. A regression is a drop that is material (`min_drop`) with `min_requests_before`
and `_after` on its sides. TTFT: log p90 over its von Neumann noise scale, so that an l2 cost is a
unit-variance Gaussian deviance; the same search and test. Deterministic, so that a backfill over
history finds what the online check found.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from itertools import pairwise
from operator import attrgetter

import numpy as np
import ruptures
from numpy.typing import NDArray
from ruptures.base import BaseCost

# Adjacent minutes' Pearson statistics count up to 9 (3 sigma) each, so that a change, one pair,
# barely moves their mean, which must then come to E[min(X, 9)] for X chi-squared(1).
_CLIP, _CLIPPED_MEAN = 9.0, 0.995007
_MIN_LOG_SIGMA = 0.01  # a 1% floor: a flat TTFT series would otherwise make every wobble a change

FloatArray = NDArray[np.float64]


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


class _SegmentCost(BaseCost):  # type: ignore[misc]
    """A segment's deviance from prefix sums of the signal's two columns: O(1) a segment, which
    matters because PELT prunes little on flat data and asks for O(points^2) of them."""

    model = "deviance_from_prefix_sums"
    min_size = 1

    def __init__(self, deviance: Callable[[float, float, int], float]) -> None:
        self.deviance = deviance

    def fit(self, signal: FloatArray) -> _SegmentCost:
        self.signal = signal
        self._first = [0.0, *np.cumsum(signal[:, 0]).tolist()]
        self._second = [0.0, *np.cumsum(signal[:, 1]).tolist()]
        return self

    def error(self, start: int, end: int) -> float:
        first, second = self._first[end] - self._first[start], self._second[end] - self._second[start]
        return self.deviance(first, second, end - start)


def _binomial_deviance(successes: float, trials: float, _points: int) -> float:
    return -2.0 * (_xlogx(successes) + _xlogx(trials - successes) - _xlogx(trials))


def _gaussian_deviance(total: float, squares: float, points: int) -> float:
    """Squared deviations from the segment's mean (ruptures' l2): -2 log-likelihood at unit variance."""
    return squares - total * total / points


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
    rho = _dispersion(requests, rates)
    trials = requests / (1.0 + (requests - 1.0) * rho)
    splits = _splits(_SegmentCost(_binomial_deviance), np.column_stack((trials * rates, trials)), config)
    return [_rate_change(points, split, rho, config) for split in splits]


def latest_drop(points: Sequence[MinutePoint], config: DetectionConfig) -> RateChange | None:
    """The most recent change that is a regression (a material drop with the evidence), if any.

    A drop that has since recovered is still returned: it happened, and a backfill must agree.
    """
    drops = [change for change in rate_changes(points, config) if change.is_regression]
    return drops[-1] if drops else None


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
    splits = _splits(_SegmentCost(_gaussian_deviance), signal, config)
    return [_level_change(values, logs, split, config) for split in splits]


def latest_rise(values: Sequence[tuple[datetime, float]], config: DetectionConfig) -> LevelChange | None:
    """The most recent TTFT change that is a regression (a material rise with the evidence)."""
    rises = [change for change in level_changes(values, config) if change.is_regression]
    return rises[-1] if rises else None


def _splits(cost: _SegmentCost, signal: FloatArray, config: DetectionConfig) -> list[_Split]:
    """PELT's changes that the test confirms, each tested against its neighbours.

    The weakest goes first and its neighbours are tested again over the segments it joins, so that
    an unconfirmed wobble next to a drop does not cut the drop's evidence short.
    """
    points = len(signal)
    search = ruptures.Pelt(custom_cost=cost, min_size=config.min_segment_points, jump=config.search_jump)
    penalty = config.penalty_factor * math.log(points)
    ends = [int(end) for end in search.fit(signal).predict(pen=penalty)]
    indices = _refined(cost, ends)
    while True:
        bounds = [0, *indices, points]
        splits = [
            _test(cost, bound, points) for bound in zip(bounds[:-2], bounds[1:-1], bounds[2:], strict=True)
        ]
        weakest = min(splits, key=attrgetter("confidence"), default=None)
        if weakest is None or weakest.confidence >= config.min_confidence:
            return splits
        indices.remove(weakest.index)


def _refined(cost: _SegmentCost, ends: list[int]) -> list[int]:
    """PELT's splits, each moved to the best between its neighbours with one point a side at least.

    PELT keeps `min_segment_points` a side; one is let in here, so that a drop is placed right when
    one minute (of enough requests) has arrived after it.
    """
    indices: list[int] = []
    for end in ends[1:]:
        start = indices[-1] if indices else 0
        indices.append(
            max(range(start + 1, end), key=lambda index: _likelihood_ratio(cost, start, index, end))
        )
    return indices


def _test(cost: _SegmentCost, bounds: tuple[int, int, int], points: int) -> _Split:
    start, index, end = bounds
    statistic = _likelihood_ratio(cost, start, index, end)
    # The split and the ends of its segments were searched for: count every segment the series admits.
    return _Split(start, index, end, statistic, _confidence(statistic, tries=points * (points - 1) // 2))


def _likelihood_ratio(cost: _SegmentCost, start: int, index: int, end: int) -> float:
    return cost.error(start, end) - cost.error(start, index) - cost.error(index, end)


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


def _dispersion(requests: FloatArray, rates: FloatArray) -> float:
    """Williams' rho in [0, 1] that brings adjacent minutes' clipped Pearson statistics to chi2(1)'s."""
    n1, n2, r1, r2 = requests[:-1], requests[1:], rates[:-1], rates[1:]
    pooled = (n1 * r1 + n2 * r2) / (n1 + n2)
    # A pair at rate 0 or 1 agrees exactly: its statistic is 0, not 0 / 0.
    spread = np.maximum(pooled * (1.0 - pooled), 1e-12)
    gaps = (r1 - r2) ** 2

    def mean_statistic(rho: float) -> float:
        variance = spread * (1.0 / n1 + 1.0 / n2 + rho * (2.0 - 1.0 / n1 - 1.0 / n2))
        return float(np.mean(np.minimum(gaps / variance, _CLIP)))

    if mean_statistic(0.0) <= _CLIPPED_MEAN:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(40):  # the statistic falls as rho grows: bisect, ending on the cautious side
        middle = (low + high) / 2.0
        low, high = (middle, high) if mean_statistic(middle) > _CLIPPED_MEAN else (low, middle)
    return high


def _confidence(statistic: float, tries: int) -> float:
    """1 - p for a likelihood ratio that was the best of `tries` (chi-squared(1), Bonferroni)."""
    p_value = max(tries, 1) * math.erfc(math.sqrt(max(statistic, 0.0) / 2.0))
    return max(0.0, 1.0 - p_value)


def _token_rate(points: Sequence[MinutePoint]) -> float:
    return sum(p.reused_tokens for p in points) / sum(p.prompt_tokens for p in points)


def _xlogx(x: float) -> float:
    return x * math.log(x) if x > 0.0 else 0.0


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
