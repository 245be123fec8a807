"""The offline analyzer's report of a trace: hit rate, miss causes per request, cache killers,
templates and prefix families, and the what-if curve of capacity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.analyzer.capacity import MULTIPLIERS, UNLIMITED_FRACTIONS, CurvePoint, curve_points
from app.analyzer.diagnose import server_names
from app.analyzer.groups import FoundKiller
from app.analyzer.lines import Lines
from app.analyzer.tally import CauseRow, GroupRow, RequestRow
from app.analyzer.trace import Built, build_requests
from app.analyzer.work import do_work
from app.domain.misses import reusable_hit_rate
from app.domain.replay.curve import CapacityCurve
from app.domain.replay.trace import TraceRequest

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class Options:
    """What to analyze with: `block_size` None takes the trace's hashes' (else 16); `blocks` per
    server, None for an unlimited cache; `curve` False leaves the what-if curve out; `jobs`:
    processes the work may use (app/analyzer/work.py)."""

    block_size: int | None = None
    blocks: int | None = None
    curve: bool = True
    jobs: int = 1
    multipliers: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """The whole report (see the module's docstring); hit rates are of all prompt tokens (OF_PROMPT),
    but `reusable_hit_rate`: the replay's of the reusable ones (OF_REUSABLE)."""

    source: str
    format: str
    requests: int
    skipped: dict[str, int]
    notes: list[str]
    servers: list[str]
    block_size: int
    blocks: int | None  # per server; None: unlimited
    prompt_tokens: int
    reported_tokens: int | None  # reused as the trace reports it; None when no request says
    reported_requests: int
    replayed_tokens: int
    reported_hit_rate: float | None
    replayed_hit_rate: float | None
    reusable_hit_rate: float | None
    causes: list[CauseRow]
    groups: list[GroupRow]
    killers: list[FoundKiller]
    curve: list[CurvePoint]
    curve_base: str
    rows: list[RequestRow]


def analyze(lines: Lines, *, source: str, options: Options) -> Report:
    """The report of a trace as read (readers.read_trace)."""
    size = options.block_size or _hashes_block_size(lines) or DEFAULT_BLOCK_SIZE
    built = build_requests(lines, size)
    notes = [*lines.notes, *built.notes]
    if lines.tokenized:
        from app.analyzer.chat import TOKENIZED_NOTE

        notes.append(TOKENIZED_NOTE.format(count=lines.tokenized))
    if options.blocks is None:
        notes.append("No KV capacity given (--blocks): the cache is taken as unlimited, nothing evicted.")
    # A trace with no request has no curve: every capacity would be "n/a".
    work = do_work(
        built, blocks=options.blocks, curve=options.curve and bool(built.requests), jobs=options.jobs
    )
    tally = work.tally
    requests = built.requests
    prompt = sum(r.prompt_tokens for r in requests)
    reported = [r.cached_tokens for r in requests if r.cached_tokens is not None]
    replayed = tally.replayed
    curve, base = _curve(work.curve, built, options, tally.footprint) if work.curve else ([], "")
    causes = tally.cause_rows()
    by_cause = {row.cause: row.tokens for row in causes}
    return Report(
        source=source, format=lines.format, requests=len(requests), skipped=dict(lines.skipped),
        notes=notes, servers=server_names(requests), block_size=size, blocks=options.blocks,
        prompt_tokens=prompt, reported_tokens=sum(reported) if reported else None,
        reported_requests=len(reported), replayed_tokens=replayed,
        reported_hit_rate=_rate(sum(reported), _reporting_prompts(requests)),
        replayed_hit_rate=_rate(replayed, prompt),
        reusable_hit_rate=reusable_hit_rate(prompt_tokens=prompt, reused_tokens=replayed, by_cause=by_cause),
        causes=causes,
        groups=tally.group_rows(), killers=work.killers,
        curve=curve, curve_base=base, rows=tally.request_rows(),
    )  # fmt: skip


def _reporting_prompts(requests: Sequence[TraceRequest]) -> int:
    """The prompt tokens of the requests that say what they reused."""
    return sum(r.prompt_tokens for r in requests if r.cached_tokens is not None)


def _hashes_block_size(lines: Lines) -> int | None:
    return next((line.block_size for line in lines.lines if line.block_hashes and line.block_size), None)


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _curve(
    curve: CapacityCurve, built: Built, options: Options, footprint: int
) -> tuple[list[CurvePoint], str]:
    if options.blocks is not None:
        base, multipliers = options.blocks, options.multipliers or MULTIPLIERS
        said = f"{options.blocks:,} blocks per server (--blocks)"
    else:
        base, multipliers = footprint, options.multipliers or UNLIMITED_FRACTIONS
        said = f"{footprint:,} blocks per server: what holds the whole trace (no capacity given)"
    return curve_points(curve, server_names(built.requests), base, multipliers), said
