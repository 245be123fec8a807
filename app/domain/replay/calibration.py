"""How well a replay of the fleet as it was reproduces what its engines reported reusing.

Every what-if starts here: the window replayed at each server's real KV blocks and block size,
routed as it happened, and compared request by request with the engines' cached tokens. Only
requests whose engine reported its reuse are compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from app.domain.replay.trace import TraceRequest

GOOD_POINTS = 2.0  # issue 26's target: the replayed hit rate within 2 points of the delivered one
FAIR_POINTS = 5.0


class Trust(StrEnum):
    GOOD = "good"  # within GOOD_POINTS
    FAIR = "fair"  # within FAIR_POINTS: read the answers as directions, not figures
    POOR = "poor"  # beyond: the replay does not reproduce this fleet; its answers are not given
    UNKNOWN = "unknown"  # no request reported its reuse


@dataclass(frozen=True, slots=True)
class Calibration:
    """The replay against the engines over the requests that reported their reuse."""

    requests: int
    prompt_tokens: int
    reported_tokens: int
    replayed_tokens: int
    exact: int  # requests whose replayed reuse equals the reported one
    uncompared: tuple[str, ...] = ()  # servers whose reports are no measure (a hit counter not wired)

    @property
    def reported_hit_rate(self) -> float | None:
        return self.reported_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def replayed_hit_rate(self) -> float | None:
        return self.replayed_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def error_points(self) -> float | None:
        """Replayed minus reported hit rate, in percentage points."""
        if not self.prompt_tokens:
            return None
        return 100 * (self.replayed_tokens - self.reported_tokens) / self.prompt_tokens

    @property
    def exact_share(self) -> float | None:
        """The share of requests the replay gave exactly the reported reuse."""
        return self.exact / self.requests if self.requests else None

    @property
    def trust(self) -> Trust:
        error = self.error_points
        if error is None:
            return Trust.UNKNOWN
        if abs(error) <= GOOD_POINTS:
            return Trust.GOOD
        return Trust.FAIR if abs(error) <= FAIR_POINTS else Trust.POOR


def calibrate(
    trace: Sequence[TraceRequest], replayed: Sequence[int], *, uncompared: Sequence[str] = ()
) -> Calibration:
    """Compare `replayed` (each request's reuse in the trace replayed as the fleet was) with what
    each request reported, but on the `uncompared` servers (their reports are no measure: a hit
    counter not wired reports none of the reuse it had)."""
    left_out = frozenset(uncompared)
    requests = prompt = reported = again = exact = 0
    for request, reused in zip(trace, replayed, strict=True):
        if request.cached_tokens is None or request.server in left_out:
            continue
        requests += 1
        prompt += request.prompt_tokens
        reported += request.cached_tokens
        again += reused
        exact += reused == request.cached_tokens
    return Calibration(requests, prompt, reported, again, exact, tuple(sorted(left_out)))
