"""Windowed hit rates survive counter resets and agree with a real server's counters."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.hitrate import Counters, counter_increase, hit_rate_series, window_hit_rate
from tests.support.captures import VLLM_CPU_FIXTURES, load_json

T0 = datetime(2026, 11, 29, 21, 0, tzinfo=UTC)


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.mark.parametrize(
    ("prev", "curr", "rate"),
    [
        (Counters(0, 0), Counters(100, 40), 0.4),
        (Counters(100, 40), Counters(300, 140), 0.5),
        (Counters(100, 40), Counters(300, 40), 0.0),
        (Counters(1000, 500), Counters(200, 50), 0.25),  # queries went back: a restart
        (Counters(1000, 500), Counters(1200, 100), 100 / 1200),  # hits went back: a restart
    ],
)
def test_window_hit_rate_is_hits_over_queries_in_the_window(
    prev: Counters, curr: Counters, rate: float
) -> None:
    assert window_hit_rate(prev, curr) == pytest.approx(rate)


def test_counter_reset_starts_a_new_window() -> None:
    before_restart = Counters(queries=5000, hits=4000)
    after_restart = Counters(queries=10, hits=1)
    assert window_hit_rate(before_restart, after_restart) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("prev", "curr"),
    [
        (Counters(0, 0), Counters(0, 0)),
        (Counters(300, 140), Counters(300, 140)),
        (Counters(300, 140), Counters(0, 0)),  # restarted and idle since
    ],
)
def test_nothing_queried_gives_no_rate(prev: Counters, curr: Counters) -> None:
    assert window_hit_rate(prev, curr) is None


def test_a_series_has_one_rate_per_window_stamped_at_its_end() -> None:
    samples = [
        (_at(0), Counters(0, 0)),
        (_at(1), Counters(100, 50)),
        (_at(2), Counters(100, 50)),
        (_at(3), Counters(40, 30)),  # restart
        (_at(4), Counters(140, 40)),
    ]
    assert hit_rate_series(samples) == [
        (_at(1), 0.5),
        (_at(2), None),
        (_at(3), 0.75),
        (_at(4), 0.1),
    ]


@pytest.mark.parametrize("samples", [[], [(_at(0), Counters(10, 5))]])
def test_fewer_than_two_samples_give_an_empty_series(
    samples: list[tuple[datetime, Counters]],
) -> None:
    assert hit_rate_series(samples) == []


@pytest.mark.parametrize("second_at", [_at(0), _at(-1)])
def test_a_series_refuses_samples_out_of_time_order(second_at: datetime) -> None:
    samples = [(_at(0), Counters(10, 5)), (second_at, Counters(20, 6))]
    with pytest.raises(ValueError, match="increase"):
        hit_rate_series(samples)


@pytest.mark.parametrize(
    ("values", "increase"),
    [
        ([], 0),
        ([5], 0),
        ([0, 0], 0),
        ([0, 10, 25], 25),
        ([10, 30, 5, 20], 40),  # 20, then a reset counting 5 in full, then 15
        ([10, 0, 7], 7),
        ([3.5, 4.0], 0.5),
    ],
)
def test_counter_increase_counts_growth_across_resets(values: list[float], increase: float) -> None:
    assert counter_increase(values) == pytest.approx(increase)


def _scraped(file_name: str, metric: str) -> int:
    text = (VLLM_CPU_FIXTURES / file_name).read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(metric)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{metric} not in {file_name}"
    return int(float(match.group(1)))


def _growth(metric: str) -> float:
    return counter_increase([_scraped(name, metric) for name in ("metrics-before.txt", "metrics-after.txt")])


def _request_usages() -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of every captured request: the log, then the stream."""
    usages = [(entry["prompt_tokens"], entry["cached"]) for entry in load_json("traffic-log.json")]
    sse = (VLLM_CPU_FIXTURES / "completion-stream.sse.txt").read_text(encoding="utf-8")
    last_chunk = [line for line in sse.splitlines() if line.startswith("data: {")][-1]
    usage = json.loads(last_chunk.removeprefix("data: "))["usage"]
    return [*usages, (usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"])]


def test_hits_growth_equals_the_cached_tokens_the_requests_reported() -> None:
    cached = sum(c for _, c in _request_usages())
    assert _growth("vllm:prefix_cache_hits_total") == cached == 960
    assert _growth("vllm:prompt_tokens_cached_total") == cached


def test_queries_growth_equals_the_prompt_tokens_the_requests_reported() -> None:
    assert _growth("vllm:prefix_cache_queries_total") == sum(p for p, _ in _request_usages()) == 4026


def test_the_window_over_the_captured_traffic_has_the_servers_hit_rate() -> None:
    before, after = (
        Counters(
            queries=_scraped(name, "vllm:prefix_cache_queries_total"),
            hits=_scraped(name, "vllm:prefix_cache_hits_total"),
        )
        for name in ("metrics-before.txt", "metrics-after.txt")
    )
    assert window_hit_rate(before, after) == pytest.approx(960 / 4026)
