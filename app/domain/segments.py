"""The segment statistics the change point search (app/domain/changepoints.py) stands on: a
segment's deviance from prefix sums, the likelihood ratio of a split and its confidence, and
Williams' overdispersion of a hit rate's minutes (the method is that module's docstring's)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray
from ruptures.base import BaseCost

# Adjacent minutes' Pearson statistics count up to 9 (3 sigma) each, so that a change, one pair,
# barely moves their mean, which must then come to E[min(X, 9)] for X chi-squared(1).
CLIP, _CLIPPED_MEAN = 9.0, 0.995007
# The start leaves out the two largest pairs (a change inside a minute spoils both pairs around it);
# a pair beyond 25 (5 sigma) at the start's rho is a change, not scatter, and is left out of the fit,
# whose target is then E[min(X, 9) | X < 25].
TRIMMED, OUTLIER = 2, 25.0
_OUTLIER_TAIL = math.erfc(math.sqrt(OUTLIER / 2.0))
_USUAL_CLIPPED_MEAN = (_CLIPPED_MEAN - CLIP * _OUTLIER_TAIL) / (1.0 - _OUTLIER_TAIL)
_MAX_ROUNDS = 10  # pairs left out and rho agree after one or two in practice

FloatArray = NDArray[np.float64]


class SegmentCost(BaseCost):  # type: ignore[misc]
    """A segment's deviance from prefix sums of the signal's two columns: O(1) a segment, which
    matters because PELT prunes little on flat data and asks for O(points^2) of them."""

    model = "deviance_from_prefix_sums"
    min_size = 1

    def __init__(self, deviance: Callable[[float, float, int], float]) -> None:
        self.deviance = deviance

    def fit(self, signal: FloatArray) -> SegmentCost:
        self.signal = signal
        self._first = [0.0, *np.cumsum(signal[:, 0]).tolist()]
        self._second = [0.0, *np.cumsum(signal[:, 1]).tolist()]
        return self

    def error(self, start: int, end: int) -> float:
        first, second = self._first[end] - self._first[start], self._second[end] - self._second[start]
        return self.deviance(first, second, end - start)


def _binomial_deviance(successes: float, trials: float, _points: int) -> float:
    return -2.0 * (_xlogx(successes) + _xlogx(trials - successes) - _xlogx(trials))


def gaussian_deviance(total: float, squares: float, points: int) -> float:
    """Squared deviations from the segment's mean (ruptures' l2): -2 log-likelihood at unit variance."""
    return squares - total * total / points


def binomial_cost(requests: FloatArray, rates: FloatArray, rho: float) -> SegmentCost:
    trials = requests / (1.0 + (requests - 1.0) * rho)
    return SegmentCost(_binomial_deviance).fit(np.column_stack((trials * rates, trials)))


def likelihood_ratio(cost: SegmentCost, start: int, index: int, end: int) -> float:
    return cost.error(start, end) - cost.error(start, index) - cost.error(index, end)


def dispersion(requests: FloatArray, rates: FloatArray) -> float:
    """Williams' rho in [0, 1] from adjacent minutes' Pearson statistics, robust to changes (see
    app/domain/changepoints.py's docstring): a start that leaves out the largest, then the mean over
    the pairs that do not stand out at it, until the pairs left out are those of the step before."""
    n1, n2, r1, r2 = requests[:-1], requests[1:], rates[:-1], rates[1:]
    pooled = (n1 * r1 + n2 * r2) / (n1 + n2)
    # A pair at rate 0 or 1 agrees exactly: its statistic is 0, not 0 / 0.
    spread = np.maximum(pooled * (1.0 - pooled), 1e-12)
    gaps = (r1 - r2) ** 2

    def statistics(rho: float) -> FloatArray:
        return gaps / (spread * (1.0 / n1 + 1.0 / n2 + rho * (2.0 - 1.0 / n1 - 1.0 / n2)))

    def clipped_mean(rho: float, among: NDArray[np.bool_]) -> float:
        return float(np.mean(np.minimum(statistics(rho)[among], CLIP)))

    kept = max(len(gaps) - TRIMMED, min(len(gaps), 2))  # two at least: one alone is too noisy
    rho = _bisected(
        lambda rho: float(np.mean(np.sort(np.minimum(statistics(rho), CLIP))[:kept])),
        _trimmed_mean_expected(len(gaps), kept),
    )
    usual = np.zeros(len(gaps), dtype=bool)  # none yet: the first round always fits
    for _ in range(_MAX_ROUNDS):
        found = statistics(rho) < OUTLIER
        if not found.any() or np.array_equal(found, usual):
            break
        usual = found
        rho = _bisected(functools.partial(clipped_mean, among=usual), _USUAL_CLIPPED_MEAN)
    return rho


@functools.cache
def _trimmed_mean_expected(pairs: int, kept: int) -> float:
    """E[mean of the `kept` smallest of `pairs` chi-squared(1) draws, each clipped at CLIP].

    The j-th smallest exceeds x when fewer than j draws are below it, a binomial(pairs, F(x)) count,
    so the sum of the kept smallest is the integral over [0, CLIP] of sum_i (kept - i) P(count = i),
    i < kept. (Adjacent pairs share a minute, so they are not quite independent: close enough.)
    """
    root = np.linspace(0.0, math.sqrt(CLIP), 2001)  # x = root^2: smooth where chi2(1)'s density is not
    below = np.clip(np.vectorize(math.erf)(root / math.sqrt(2.0)), 1e-300, 1.0 - 1e-16)
    total = np.zeros_like(root)
    for count in range(kept):
        log_choose = math.lgamma(pairs + 1) - math.lgamma(count + 1) - math.lgamma(pairs - count + 1)
        chance = np.exp(log_choose + count * np.log(below) + (pairs - count) * np.log1p(-below))
        total += (kept - count) * chance
    return float(np.trapezoid(total * 2.0 * root, root)) / kept


def _bisected(statistic: Callable[[float], float], target: float) -> float:
    """The rho in [0, 1] where a statistic falling with rho comes to `target`, on the cautious side."""
    if statistic(0.0) <= target:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2.0
        low, high = (middle, high) if statistic(middle) > target else (low, middle)
    return high


def confidence(statistic: float, tries: int) -> float:
    """1 - p for a likelihood ratio that was the best of `tries` (chi-squared(1), Bonferroni)."""
    p_value = max(tries, 1) * math.erfc(math.sqrt(max(statistic, 0.0) / 2.0))
    return max(0.0, 1.0 - p_value)


def _xlogx(x: float) -> float:
    return x * math.log(x) if x > 0.0 else 0.0
