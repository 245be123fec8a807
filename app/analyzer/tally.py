"""What the report reads of the requests' diagnoses, summed where they were made.

Each diagnosis task of the analyzer (work.py: an independent part of the trace, or the whole of
it) tallies its own requests: per cause, per template or family, and one row per request. Only
the tally comes back from a worker, plain tuples and counters that pickle fast, not the
diagnoses with their losses; the report adds the tallies up (in any order: they are sums, and
rows keep their place in the trace).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.analyzer.diagnose import Diagnosed
from app.analyzer.groups import Group, group_of
from app.analyzer.trace import Built
from app.domain.misses import Diagnosis

REUSED = "reused"  # the main cause named for a request that lost nothing reusable


@dataclass(frozen=True, slots=True)
class CauseRow:
    """A miss cause: the requests it is the main cause of, and the tokens it lost over all."""

    cause: str
    requests: int
    tokens: int


@dataclass(frozen=True, slots=True)
class GroupRow:
    """What a template or family's requests reused and lost."""

    group: Group
    requests: int
    prompt_tokens: int
    reused_tokens: int
    main_cause: str  # the cause that lost it the most tokens ("" when none lost any)

    @property
    def hit_rate(self) -> float | None:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One request's answer. `cached_tokens`: what it reused (reported, else replayed); `cause`:
    its main cause, "" when nothing reusable was lost, or why it has no diagnosis."""

    request_id: str
    server: str
    group: str
    prompt_tokens: int
    cached_tokens: int | None
    replayed_tokens: int
    cause: str
    diverged_at: int | None
    lost: dict[str, int]


_Row = tuple[str, str, str, int, int | None, int, str, int | None, dict[str, int]]  # RequestRow's fields


@dataclass(slots=True)
class Tally:
    """Some requests' diagnoses, summed. `groups`: a group's requests, prompt tokens and reused
    tokens; `stored`: the blocks each server stored of theirs (diagnose.py's Diagnosed)."""

    main: Counter[str] = field(default_factory=Counter)  # requests by main cause, REUSED, or unknown
    lost: Counter[str] = field(default_factory=Counter)  # tokens lost by cause
    groups: dict[Group, list[int]] = field(default_factory=dict)
    group_lost: dict[Group, Counter[str]] = field(default_factory=dict)
    rows: dict[int, _Row] = field(default_factory=dict)  # by the request's index in the trace
    replayed: int = 0
    stored: list[int] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        """Add another tally's requests (none of them this one's)."""
        self.main.update(other.main)
        self.lost.update(other.lost)
        for group, (requests, prompt, reused) in other.groups.items():
            mine = self.groups.setdefault(group, [0, 0, 0])
            mine[0] += requests
            mine[1] += prompt
            mine[2] += reused
        for group, lost in other.group_lost.items():
            self.group_lost.setdefault(group, Counter()).update(lost)
        self.rows.update(other.rows)
        self.replayed += other.replayed
        mine = self.stored or [0] * len(other.stored)
        self.stored = [a + b for a, b in zip(mine, other.stored, strict=True)]

    @property
    def footprint(self) -> int:
        """The blocks that hold every server's stored blocks unevicted (the most of them, and one)."""
        return max(self.stored, default=0) + 1

    def cause_rows(self) -> list[CauseRow]:
        """Each cause's requests and tokens, the costliest first; REUSED for requests that lost
        nothing reusable, and the reasons requests could not be diagnosed."""
        main, lost = self.main, self.lost
        names = sorted(set(main) | set(lost), key=lambda name: (-lost[name], -main[name], name))
        return [CauseRow(name, main[name], lost[name]) for name in names]

    def group_rows(self) -> list[GroupRow]:
        """Every group's totals, most prompt tokens first."""
        rows = [
            GroupRow(group, requests, prompt, reused, _main(self.group_lost.get(group, Counter())))
            for group, (requests, prompt, reused) in self.groups.items()
        ]
        return sorted(rows, key=lambda row: (-row.prompt_tokens, row.group.name, row.group.kind))

    def request_rows(self) -> list[RequestRow]:
        """One row per request, in the trace's order."""
        return [RequestRow(*self.rows[index]) for index in sorted(self.rows)]


def tally(built: Built, indices: Sequence[int] | None, diagnosed: Diagnosed) -> Tally:
    """The tally of the requests at `indices` of `built` (None: all), `diagnosed` in that order."""
    found = Tally(replayed=sum(diagnosed.replayed), stored=list(diagnosed.stored))
    size = built.block_size
    chosen = range(len(built.requests)) if indices is None else indices
    for index, diagnosis, reused in zip(chosen, diagnosed.diagnoses, diagnosed.replayed, strict=True):
        request = built.requests[index]
        group = group_of(request, size)
        cached: int | None
        if isinstance(diagnosis, Diagnosis):
            cause = diagnosis.cause.value if diagnosis.cause else ""
            lost = {loss.value: tokens for loss, tokens in diagnosis.tokens_by_cause().items()}
            cached, diverged = diagnosis.funnel.reused, diagnosis.diverged_at
            found.main[cause or REUSED] += 1
            found.lost.update(lost)
        else:
            cause, lost, cached, diverged = diagnosis.value, {}, request.cached_tokens, None
            found.main[cause] += 1
        found.rows[index] = (request.request_id, request.server, group.name if group else "",
                             request.prompt_tokens, cached, reused, cause, diverged, lost)  # fmt: skip
        if group is not None:
            totals = found.groups.setdefault(group, [0, 0, 0])
            totals[0] += 1
            totals[1] += request.prompt_tokens
            totals[2] += cached if isinstance(diagnosis, Diagnosis) and cached is not None else 0
            if lost:
                found.group_lost.setdefault(group, Counter()).update(lost)
    return found


def _main(lost: Counter[str]) -> str:
    found = lost.most_common(1)
    return found[0][0] if found and found[0][1] else ""


def tallied(tallies: Sequence[Tally]) -> Tally:
    """The tallies added up."""
    whole = Tally()
    for part in tallies:
        whole.add(part)
    return whole
