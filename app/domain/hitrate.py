"""Prefix-cache hit rates from cumulative counters that reset when a server restarts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise


@dataclass(frozen=True, slots=True)
class Counters:
    """Cumulative prefix-cache counters from one scrape (tokens queried, tokens hit)."""

    queries: int
    hits: int


@dataclass(frozen=True, slots=True)
class RequestSums:
    """A scope's request records summed over a window, as the request rollups keep them: its requests,
    their prompt tokens and cached (reused) tokens, and the prompt tokens of those that reported their
    cached tokens (a request that did not is left out of the hit rate, not counted as a miss)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_known_prompt_tokens: int = 0

    def __add__(self, other: RequestSums) -> RequestSums:
        return RequestSums(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.cache_known_prompt_tokens + other.cache_known_prompt_tokens,
        )

    @property
    def hit_rate(self) -> float | None:
        """Delivered hit rate, weighted by tokens; None when no request reported its cached tokens."""
        known = self.cache_known_prompt_tokens
        return self.cached_tokens / known if known else None

    def reused_per_request(self) -> float | None:
        """Mean reused prompt tokens per request: the hit rate times the prompt tokens per request
        (cached tokens over requests when every request reported them); None without a hit rate."""
        rate = self.hit_rate
        return None if rate is None or not self.requests else rate * self.prompt_tokens / self.requests


def window_hit_rate(prev: Counters, curr: Counters) -> float | None:
    """Hit rate between two scrapes; None when nothing was queried.

    Counters going backwards mean the server restarted: the current values are the
    whole window.
    """
    if curr.queries < prev.queries or curr.hits < prev.hits:
        prev = Counters(queries=0, hits=0)
    queried = curr.queries - prev.queries
    return None if queried == 0 else (curr.hits - prev.hits) / queried


def hit_rate_series(
    samples: Sequence[tuple[datetime, Counters]],
) -> list[tuple[datetime, float | None]]:
    """Return the hit rate of each window between consecutive scrapes.

    Each point is stamped with the time of the scrape that closes its window, so n
    samples give n - 1 points (none for fewer than two). Raises ValueError unless the
    sample times strictly increase: out-of-order scrapes would look like restarts.
    """
    series: list[tuple[datetime, float | None]] = []
    for (prev_at, prev), (at, curr) in pairwise(samples):
        if at <= prev_at:
            raise ValueError(f"scrape times must increase: {at} after {prev_at}")
        series.append((at, window_hit_rate(prev, curr)))
    return series


def counter_increase(values: Sequence[float]) -> float:
    """Return how much a cumulative counter grew over a series of scraped values.

    Like Prometheus' ``increase()``, a value lower than the one before is a reset, so
    it counts in full (the counter restarted from zero); unlike it, nothing is
    extrapolated to window edges. 0 for fewer than two values.
    """
    return sum(curr - prev if curr >= prev else curr for prev, curr in pairwise(values))
