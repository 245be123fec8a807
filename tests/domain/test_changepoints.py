"""Change points find real drops in a hit rate or a TTFT, where they happened, and nothing in noise.

Traffic is simulated with numpy's seeded generator: each request reuses its whole prompt or none of
it, as requests do behind a volatile token near the top, so tokens are far from independent trials.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from app.domain.changepoints import (
    DetectionConfig,
    MinutePoint,
    latest_drop,
    latest_rise,
    level_changes,
    measured_from,
    rate_changes,
)

T0 = datetime(2026, 11, 29, 21, 0, tzinfo=UTC)
CONFIG = DetectionConfig()
SEEDS = range(50)


def _traffic(
    rng: np.random.Generator,
    rates: Sequence[float],
    requests: Sequence[int],
    minutes: Sequence[int] | None = None,
) -> list[MinutePoint]:
    """One point a minute (at `minutes`, default 0, 1, 2 ...) of requests hitting at `rates`."""
    points = []
    for i, (rate, count) in enumerate(zip(rates, requests, strict=True)):
        prompts = rng.integers(400, 2000, size=int(count))
        hits = rng.random(int(count)) < rate
        minute = T0 + timedelta(minutes=i if minutes is None else minutes[i])
        points.append(MinutePoint(minute, int(count), int(prompts.sum()), int(prompts[hits].sum())))
    return points


def _steady(rng: np.random.Generator, points: int, mean: float = 5.0) -> list[int]:
    return [int(n) for n in rng.poisson(mean, points) + 1]


def _tenfold_swings(rng: np.random.Generator, points: int) -> list[int]:
    """Half-hours of about 5 requests a minute, then of about 50."""
    means = np.where((np.arange(points) // 30) % 2 == 0, 4, 49)
    return [int(n) for n in rng.poisson(means) + 1]


def _drop(seed: int, after: int, before: float = 0.9, to: float = 0.05) -> list[MinutePoint]:
    """Two hours at `before`, then `after` minutes at `to`: the fault is at point 120."""
    rng = np.random.default_rng(seed)
    return _traffic(rng, [before] * 120 + [to] * after, _steady(rng, 120 + after))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_collapse_is_found_at_its_minute_with_high_confidence(seed: int) -> None:
    drop = latest_drop(_drop(seed, after=60), CONFIG)
    assert drop is not None
    assert abs(drop.index - 120) <= 1
    assert drop.minute == T0 + timedelta(minutes=drop.index)
    assert drop.confidence > 0.999
    assert drop.rate_before == pytest.approx(0.9, abs=0.1)
    assert drop.rate_after == pytest.approx(0.05, abs=0.05)
    assert drop.drop == pytest.approx(drop.rate_before - drop.rate_after)


def test_the_figures_are_the_segments_either_side() -> None:
    points = _drop(0, after=60)
    drop = latest_drop(points, CONFIG)
    assert drop is not None
    before, after = points[: drop.index], points[drop.index :]
    assert drop.requests_before == sum(p.requests for p in before)
    assert drop.prompt_tokens_after == sum(p.prompt_tokens for p in after)
    assert drop.rate_after == sum(p.reused_tokens for p in after) / drop.prompt_tokens_after


@pytest.mark.parametrize("requests_per_minute", [4.0, 60.0])
def test_a_collapse_is_reported_once_fifty_requests_arrived_after_it(requests_per_minute: float) -> None:
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        requests = _steady(rng, 140, requests_per_minute)
        points = _traffic(rng, [0.9] * 120 + [0.05] * 20, requests)
        fiftieth = next(end for end in range(121, 141) if sum(requests[120:end]) >= 50)
        drop = latest_drop(points[:fiftieth], CONFIG)
        assert drop is not None, seed
        assert abs(drop.index - 120) <= 1  # the minute after the fault may hit by chance


def test_too_few_requests_after_a_drop_are_not_yet_a_regression() -> None:
    points = _traffic(np.random.default_rng(7), [0.9] * 120 + [0.05] * 12, [5] * 132)
    assert latest_drop(points[:122], CONFIG) is None  # 10 requests after it
    change = rate_changes(points[:122], CONFIG)[-1]
    assert (change.index, change.material, change.enough_evidence) == (120, True, False)
    drop = latest_drop(points, CONFIG)  # 60 requests after it
    assert drop is not None and drop.index == 120


SERVICE = DetectionConfig(min_segment_points=1)  # as app/regressions/services.py configures it


def _short_history(seed: int, before: int, after: int) -> list[MinutePoint]:
    """A first part-minute and `before` whole ones at 0.82, about 118 requests a minute (the real vLLM
    check's traffic), then `after` minutes at 0 (a timestamp moved to the top)."""
    rng = np.random.default_rng(seed)
    requests = [40, *(int(n) for n in rng.poisson(118, before + after))]
    return _traffic(rng, [0.82] * (1 + before) + [0.0] * after, requests)


def test_a_drop_after_two_minutes_of_history_is_found() -> None:
    # The pair across the drop says nothing about the scatter within the rates: left out of the
    # dispersion's fit, it no longer makes 118 requests count as four trials (rho was 0.21-0.28).
    found = {1: 0, 2: 0}
    for seed in range(20):
        for after in found:
            drop = latest_drop(_short_history(seed, before=2, after=after), SERVICE)
            if drop is not None:
                assert (drop.index, drop.confidence > 0.999) == (3, True)
                assert drop.dispersion < 0.05  # token-weighted rates of prompts of many sizes
                found[after] += 1
    assert found == {1: 18, 2: 20}  # 0 and 0 with the plain clipped mean over the three pairs


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda rng: _traffic(rng, [0.82] * 12, _steady(rng, 12, 118)), id="flat"),
        pytest.param(lambda rng: _traffic(rng, [0.8] * 240, _tenfold_swings(rng, 240)), id="tenfold-swings"),
        pytest.param(
            lambda rng: _traffic(rng, 0.85 + rng.uniform(-0.1, 0.1, 240), _tenfold_swings(rng, 240)),
            id="overdispersed-tenfold-swings",
        ),
    ],
)
def test_fault_free_series_read_as_the_service_reads_them_have_no_regression(
    make: Callable[[np.random.Generator], list[MinutePoint]],
) -> None:
    """Every prefix a run would read from a new scope's first minutes (then every 20th): 50 seeds,
    1,950 series in all, and the service's one-minute segments."""
    for seed in SEEDS:
        points = make(np.random.default_rng(seed))
        for end in [*range(3, min(len(points), 12) + 1), *range(20, len(points) + 1, 20)]:
            assert latest_drop(points[:end], SERVICE) is None, (seed, end)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda rng: _traffic(rng, [0.8] * 240, _tenfold_swings(rng, 240)), id="tenfold-swings"),
        pytest.param(
            # ten minutes of traffic, five idle (absent), and so on
            lambda rng: _traffic(
                rng, [0.8] * 240, _steady(rng, 240, 10), [m for m in range(360) if m % 15 < 10]
            ),
            id="idle-gaps",
        ),
        pytest.param(
            lambda rng: _traffic(rng, 0.85 + rng.uniform(-0.1, 0.1, 240), _steady(rng, 240, 30)),
            id="overdispersed",
        ),
        pytest.param(
            lambda rng: _traffic(rng, 0.85 + rng.uniform(-0.1, 0.1, 240), _tenfold_swings(rng, 240)),
            id="overdispersed-tenfold-swings",
        ),
    ],
)
def test_fault_free_traffic_has_no_regression(
    make: Callable[[np.random.Generator], list[MinutePoint]],
) -> None:
    for seed in SEEDS:
        points = make(np.random.default_rng(seed))
        assert latest_drop(points, CONFIG) is None, seed


def test_overdispersion_is_estimated_and_the_drop_still_found() -> None:
    rng = np.random.default_rng(3)
    scattered = np.r_[0.85 + rng.uniform(-0.1, 0.1, 120), 0.3 + rng.uniform(-0.1, 0.1, 60)]
    (drop,) = rate_changes(_traffic(rng, scattered, _steady(rng, 180, 30)), CONFIG)
    # uniform +/-0.1 is a variance of 0.0033, rho = 0.0033 / (0.85 * 0.15) = 0.026 (plus prompt sizes)
    assert drop.dispersion == pytest.approx(0.03, abs=0.015)
    assert (drop.index, drop.is_regression) == (120, True)


@pytest.mark.parametrize("seed", range(10))
def test_a_small_drop_is_never_material_at_the_default_minimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = _traffic(rng, [0.9] * 120 + [0.85] * 120, _steady(rng, 240, 30))
    assert all(not change.material for change in rate_changes(points, CONFIG))
    assert latest_drop(points, CONFIG) is None


def test_a_template_with_a_lower_minimum_drop_gets_a_small_drop() -> None:
    rng = np.random.default_rng(0)
    points = _traffic(rng, [0.9] * 120 + [0.85] * 120, _steady(rng, 240, 30))
    drop = latest_drop(points, DetectionConfig(min_drop=0.02))
    assert drop is not None and drop.drop == pytest.approx(0.05, abs=0.02)


def test_a_recovery_is_a_rise_not_a_drop() -> None:
    rise = rate_changes(_drop(1, after=60, before=0.05, to=0.9), CONFIG)
    assert [(change.index, change.drop < -0.8) for change in rise] == [(120, True)]
    assert latest_drop(_drop(1, after=60, before=0.05, to=0.9), CONFIG) is None


def test_a_drop_that_recovered_is_still_the_latest_drop() -> None:
    rng = np.random.default_rng(2)
    points = _traffic(rng, [0.9] * 60 + [0.05] * 30 + [0.9] * 60, _steady(rng, 150))
    assert [change.index for change in rate_changes(points, CONFIG)] == [60, 90]
    drop = latest_drop(points, CONFIG)
    assert drop is not None and drop.index == 60


def test_a_drop_measured_from_a_stable_start_reads_that_segments_rate() -> None:
    rng = np.random.default_rng(3)
    # Good, a short bad spell the search may fold into "before", good again, then the drop.
    rates = [0.95] * 30 + [0.3] * 3 + [0.95] * 10 + [0.3] * 10
    points = _traffic(rng, rates, _steady(rng, len(rates), mean=30))
    drop = latest_drop(points, CONFIG)
    assert drop is not None and drop.index == 43
    stable = measured_from(points, drop, start=33, config=CONFIG)
    expected = sum(p.reused_tokens for p in points[33:43]) / sum(p.prompt_tokens for p in points[33:43])
    assert stable.rate_before == expected and stable.requests_before == sum(p.requests for p in points[33:43])
    assert stable.rate_after == drop.rate_after and stable.confidence > 0.999 and stable.is_regression


@pytest.mark.parametrize("seed", range(5))
def test_a_coarser_search_places_a_drop_as_exactly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = _traffic(rng, [0.9] * 123 + [0.05] * 40, _steady(rng, 163))  # off PELT's coarse grid
    exact, coarse = latest_drop(points, CONFIG), latest_drop(points, DetectionConfig(search_jump=5))
    assert exact is not None and coarse is not None
    assert coarse.index == exact.index


def test_the_same_series_gives_the_same_changes() -> None:
    assert rate_changes(_drop(4, after=30), CONFIG) == rate_changes(_drop(4, after=30), CONFIG)


@pytest.mark.parametrize("points", [[], _drop(0, after=0)[:3]])
def test_a_series_too_short_to_split_has_no_change(points: list[MinutePoint]) -> None:
    assert rate_changes(points, CONFIG) == []


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (MinutePoint(T0, 5, 100, 50), "increase"),
        (MinutePoint(T0 - timedelta(minutes=1), 5, 100, 50), "increase"),
        (MinutePoint(T0 + timedelta(minutes=1), 0, 100, 50), "request"),
        (MinutePoint(T0 + timedelta(minutes=1), 5, 0, 0), "prompt token"),
        (MinutePoint(T0 + timedelta(minutes=1), 5, 100, 101), "reused"),
        (MinutePoint(T0 + timedelta(minutes=1), 5, 100, -1), "reused"),
    ],
)
def test_invalid_points_are_refused(second: MinutePoint, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rate_changes([MinutePoint(T0, 5, 100, 50), second], CONFIG)


def test_the_parameters_are_json_and_name_the_method() -> None:
    parameters = json.loads(json.dumps(DetectionConfig(min_drop=0.3).parameters()))
    assert parameters["min_drop"] == 0.3
    assert "Pelt" in str(parameters["method"])


def _ttft(
    rng: np.random.Generator, levels: Sequence[float], noise: float = 0.3
) -> list[tuple[datetime, float]]:
    """Per-minute p90 seconds, log-normally scattered around `levels`."""
    scatter = np.exp(noise * rng.standard_normal(len(levels)))
    return [
        (T0 + timedelta(minutes=i), float(level * s))
        for i, (level, s) in enumerate(zip(levels, scatter, strict=True))
    ]


@pytest.mark.parametrize("seed", range(20))
def test_a_tripled_ttft_is_found(seed: int) -> None:
    rise = latest_rise(_ttft(np.random.default_rng(seed), [0.4] * 120 + [1.2] * 30), CONFIG)
    assert rise is not None
    assert abs(rise.index - 120) <= 2
    assert rise.ratio == pytest.approx(3.0, rel=0.3)
    assert rise.confidence > 0.999


def test_a_steady_noisy_ttft_has_no_rise() -> None:
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        assert latest_rise(_ttft(rng, [0.4] * 240), CONFIG) is None, seed
        spikes = np.exp(0.2 * rng.standard_t(3, 240))  # heavy tails: a few minutes far out
        heavy_tailed = [(T0 + timedelta(minutes=i), 0.4 * float(s)) for i, s in enumerate(spikes)]
        assert latest_rise(heavy_tailed, CONFIG) is None, seed


def test_a_ttft_that_fell_is_no_rise() -> None:
    values = _ttft(np.random.default_rng(5), [1.2] * 120 + [0.4] * 30)
    (fall,) = level_changes(values, CONFIG)
    assert fall.ratio == pytest.approx(1 / 3, rel=0.3)
    assert latest_rise(values, CONFIG) is None


@pytest.mark.parametrize(
    "values",
    [
        [(T0, 0.5), (T0, 0.6)],
        [(T0, 0.5), (T0 + timedelta(minutes=1), 0.0)],
    ],
)
def test_invalid_ttft_values_are_refused(values: list[tuple[datetime, float]]) -> None:
    with pytest.raises(ValueError):
        level_changes(values, CONFIG)
