"""What a load-generator run did: one result per request, the admin calls made, totals and a report.

``simulator.sender.run`` returns a ``RunSummary``; ``format_summary`` is the report its CLI prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class RequestResult:
    """How one planned request went. ``status`` is 0 when no HTTP answer came (refused, timed out);
    ``error`` is None for a success, else a short reason; ``latency`` is wall seconds to the last byte."""

    index: int
    at: float
    server: int
    template: str
    version: str
    tenant: str
    request_id: str
    stream: bool
    status: int
    prompt_tokens: int | None
    cached_tokens: int | None
    latency: float
    error: str | None


@dataclass(frozen=True, slots=True)
class AdminCall:
    """One admin call a fault made: virtual time ``at``; ``sent_after`` and ``answered_after`` wall
    seconds into the run (a restart is done by its answer: requests in between met either process)."""

    at: float
    server: int
    action: Literal["capacity", "restart", "undecodable_kv_events"]
    status: int
    error: str | None
    sent_after: float
    answered_after: float


@dataclass(frozen=True, slots=True)
class RunSummary:
    """Everything a run did: results in plan order, admin calls in time order, and totals."""

    results: tuple[RequestResult, ...]
    admin_calls: tuple[AdminCall, ...]
    wall_seconds: float

    @property
    def requests(self) -> int:
        """Requests sent."""
        return len(self.results)

    @property
    def errors(self) -> int:
        """Requests that failed: HTTP 4xx/5xx, no answer, or an unreadable answer."""
        return sum(1 for result in self.results if result.error is not None)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over the answers that reported them."""
        return sum(result.prompt_tokens or 0 for result in self.results)

    @property
    def cached_tokens(self) -> int:
        """Cached prompt tokens over the answers that reported them."""
        return sum(result.cached_tokens or 0 for result in self.results)

    @property
    def hit_rate(self) -> float | None:
        """cached_tokens / prompt_tokens; None when no prompt tokens were reported."""
        return None if self.prompt_tokens == 0 else self.cached_tokens / self.prompt_tokens


def format_summary(summary: RunSummary) -> str:
    """A plain-text report: totals, admin calls, and requests and hit rate per template version."""
    rate = "n/a" if summary.hit_rate is None else f"{summary.hit_rate:.1%}"
    lines = [
        f"requests {summary.requests}, errors {summary.errors}, prompt tokens {summary.prompt_tokens}, "
        f"cached {summary.cached_tokens} ({rate}), {summary.wall_seconds:.1f} s",
    ]
    for call in summary.admin_calls:
        lines.append(f"  t={call.at:g}s {call.action} server {call.server}: {call.error or 'ok'}")
    groups: dict[tuple[str, str], list[RequestResult]] = {}
    for result in summary.results:
        groups.setdefault((result.template, result.version), []).append(result)
    for (template, version), results in groups.items():
        prompt = sum(r.prompt_tokens or 0 for r in results)
        cached = sum(r.cached_tokens or 0 for r in results)
        share = "n/a" if prompt == 0 else f"{cached / prompt:.1%}"
        errors = sum(1 for r in results if r.error is not None)
        lines.append(f"  {template} {version[:10]}: {len(results)} requests, {errors} errors, cached {share}")
    return "\n".join(lines)
