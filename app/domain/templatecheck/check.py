"""A template check over a commit range: each template checked at base and at head, the change between
them, its golden copy and its price, gathered into a report with an exit status.

The caller (app/prompts/checking.py) reads the repository, the describing file, the tokenizer and the
traffic; everything here is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from app.domain.templatecheck.analysis import Side, Template, Tokenizer, check_side
from app.domain.templatecheck.change import Change, change_findings, compare_sides, golden_findings
from app.domain.templatecheck.findings import Finding, Rule
from app.domain.templatecheck.perturb import Conditions
from app.domain.templatecheck.price import Predicted, Traffic, predict
from app.domain.templatecheck.render import RenderError

EXIT_PASSED, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Pair:
    """One template file at base and at head (None where it does not exist), with its golden copy's
    path and text at head when the repository keeps one (``golden_text`` None: the file is missing)."""

    name: str
    path: str
    base: Template | None
    head: Template | None
    golden_path: str | None = None
    golden_text: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """What the check found for one template. ``state``: added, removed, changed or unchanged."""

    name: str
    path: str
    state: str
    base: Side | None = None
    head: Side | None = None
    change: Change | None = None
    traffic: Traffic | None = None
    predicted: Predicted | None = None
    findings: tuple[Finding, ...] = ()
    golden_path: str | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """A whole check: what was compared, each template's result, and the server's answer (``pricing``:
    "priced", or why not)."""

    base: str
    head: str
    block_size: int
    tokenizer: str
    results: tuple[Result, ...]
    pricing: str
    max_cost_per_hour: float | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def findings(self) -> list[Finding]:
        return [finding for result in self.results for finding in result.findings]

    @property
    def exit_status(self) -> int:
        """2 when a template could not be rendered, 1 on an error finding, else 0."""
        if any(f.rule == Rule.CANNOT_RENDER for f in self.findings):
            return EXIT_CANNOT_RUN
        return EXIT_FAILED if any(f.level == "error" for f in self.findings) else EXIT_PASSED


def check_pairs(
    pairs: Sequence[Pair],
    tokenizer: Tokenizer,
    *,
    block_size: int,
    now: Conditions,
    traffic: Mapping[str, Traffic] | None,
    max_cost_per_hour: float | None,
) -> list[Result]:
    """Each pair checked; ``traffic`` None when no server was asked (then nothing is priced)."""
    return [
        _check_pair(
            pair, tokenizer, block_size=block_size, now=now, traffic=traffic, max_cost=max_cost_per_hour
        )
        for pair in pairs
    ]


def _check_pair(
    pair: Pair,
    tokenizer: Tokenizer,
    *,
    block_size: int,
    now: Conditions,
    traffic: Mapping[str, Traffic] | None,
    max_cost: float | None,
) -> Result:
    state = _state(pair)
    if pair.head is None:
        return Result(pair.name, pair.path, state)
    try:
        head = check_side(pair.head, tokenizer, block_size=block_size, now=now)
        base = check_side(pair.base, tokenizer, block_size=block_size, now=now) if pair.base else None
    except RenderError as exc:
        return Result(
            pair.name,
            pair.path,
            state,
            findings=(Finding(Rule.CANNOT_RENDER, "error", pair.name, pair.path, str(exc)),),
        )
    findings = list(head.findings)
    if pair.golden_path is not None:
        findings += golden_findings(pair.name, pair.path, head, pair.golden_text, pair.golden_path)
    if base is None:
        return Result(
            pair.name, pair.path, state, None, head, findings=tuple(findings), golden_path=pair.golden_path
        )
    change = compare_sides(base, head)
    findings += change_findings(pair.name, pair.path, change, block_size)
    seen = traffic.get(pair.name) if traffic is not None else None
    changed = change.departs_at is not None
    predicted = predict(seen, change, block_size=block_size) if changed and seen and seen.requests else None
    findings = _priced(pair, findings, change, seen, predicted, max_cost, asked=traffic is not None)
    return Result(
        pair.name, pair.path, state, base, head, change, seen, predicted, tuple(findings), pair.golden_path
    )


def _state(pair: Pair) -> str:
    if pair.base is None:
        return "added"
    if pair.head is None:
        return "removed"
    return "changed" if pair.base.source != pair.head.source else "unchanged"


def _priced(
    pair: Pair,
    findings: list[Finding],
    change: Change,
    traffic: Traffic | None,
    predicted: Predicted | None,
    max_cost: float | None,
    *,
    asked: bool,
) -> list[Finding]:
    """With a threshold and a price, a shrinking prefix fails on its price alone: over the threshold
    is an error, under it a warning. A changed prefix the server has no traffic for says so."""
    if asked and predicted is None and change.departs_at is not None:
        unpriced = "no traffic of this template on the server over the window: not priced"
        findings.append(Finding(Rule.NO_TRAFFIC, "note", pair.name, pair.path, unpriced))
    if predicted is None or max_cost is None:
        return findings
    judged = [replace(f, level="warning") if f.rule == Rule.PREFIX_SHRINKS else f for f in findings]
    if predicted.money_per_hour > max_cost:
        judged.append(Finding(
            Rule.COST_OVER_THRESHOLD, "error", pair.name, pair.path,
            f"predicted cost ${predicted.money_per_hour:.2f}/h is over the threshold ${max_cost:.2f}/h "
            f"({predicted.tokens_per_hour:,.0f} prefill tokens an hour)", change.line, change.departs_at,
        ))  # fmt: skip
    return judged
