"""The report as a terminal summary and as a static HTML page (its charts drawn as SVG here: the
page carries no script and loads nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

from jinja2 import Environment, select_autoescape

from app.analyzer.report import Report
from app.domain.misses import OF_PROMPT, OF_REUSABLE, cause_label

TOP = 10  # rows of each table in the summary
PAGE_ROWS = 500  # requests listed on the page (the JSON has them all)
NO_REQUESTS = "No request could be read from the trace: nothing to analyze."


def _percent(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def terminal_summary(report: Report) -> str:
    """A few screens of plain text: the figures, causes, killers, groups and curve."""
    out = [
        f"{report.source} ({report.format}): {report.requests:,} requests,"
        f" {report.prompt_tokens:,} prompt tokens,"
        f" {len(report.servers)} server(s), block size {report.block_size},"
        f" {'unlimited KV blocks' if report.blocks is None else f'{report.blocks:,} KV blocks per server'}",
    ]
    if report.skipped:
        out.append(
            "skipped lines: "
            + ", ".join(f"{reason} {count}" for reason, count in sorted(report.skipped.items()))
        )
    out += [f"note: {note}" for note in report.notes]
    if not report.requests:
        out.append(NO_REQUESTS)
        return "\n".join(out)
    reported = _percent(report.reported_hit_rate)
    out.append(f"hit rate ({OF_PROMPT}): {reported} reported ({report.reported_requests:,} requests say),"
               f" {_percent(report.replayed_hit_rate)} replayed")  # fmt: skip
    out.append(f"hit rate of reusable tokens, replayed: {_percent(report.reusable_hit_rate)} ({OF_REUSABLE})")
    width = max((len(_label(row.cause)) for row in report.causes), default=0)
    out += ["", f"{'miss causes':<{width + 2}} {'requests':>8}  tokens not reused"]
    out += [f"  {_label(row.cause):<{width}} {row.requests:>8,}  {row.tokens:>11,}" for row in report.causes]
    out += ["", "cache killers"]
    out += [
        f"  {k.group.name} at token {k.killer.position_token if k.killer.position_token is not None else '?'}"
        f" (block {k.killer.position_block}): {k.killer.klass.value},"
        f" {k.killer.requests_affected:,} requests,"
        f" {k.killer.tokens_lost:,} tokens lost. {k.killer.suggestion}"
        for k in report.killers[:TOP]
    ] or ["  none found"]
    out += ["", "templates and prefix families     requests  hit rate  main cause"]
    out += [
        f"  {row.group.kind[0]} {row.group.name[:30]:<30} {row.requests:>8,}"
        f"  {_percent(row.hit_rate):>8}  {_label(row.main_cause)}"
        for row in report.groups[:TOP]
    ]
    if len(report.groups) > TOP:
        out.append(f"  ... {len(report.groups) - TOP} more (--json, --html)")
    if report.curve:
        out += ["", f"what-if: capacity (base {report.curve_base})"]
        out += [
            f"  x{p.multiplier:<6g} {p.blocks:>12,} blocks  {_percent(p.hit_rate):>7}" for p in report.curve
        ]
    return "\n".join(out)


def _label(cause: str) -> str:
    return cause_label(cause) if cause and cause != "reused" else cause or "-"


@dataclass(frozen=True, slots=True)
class _Bar:
    label: str
    value: str
    width: float  # percent of the chart's width
    css: str


@dataclass(frozen=True, slots=True)
class _Curve:
    points: str  # an SVG polyline's points
    dots: list[tuple[float, float, str, str]]  # x, y, label below, value above


def html_page(report: Report) -> str:
    """The report as one HTML page, light and dark with the viewer's preference."""
    environment = Environment(
        autoescape=select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True
    )
    template = environment.from_string((files("app.analyzer") / "report.html").read_text(encoding="utf-8"))
    return template.render(
        report=report, percent=_percent, label=_label, cause_bars=_cause_bars(report),
        curve=_curve(report), rows=report.rows[:PAGE_ROWS], of_prompt=OF_PROMPT, of_reusable=OF_REUSABLE,
        no_requests=NO_REQUESTS,
    )  # fmt: skip


def _cause_bars(report: Report) -> list[_Bar]:
    """Reused and lost tokens, each a share of all prompt tokens."""
    lost = [row for row in report.causes if row.tokens]
    whole = max(report.prompt_tokens, 1)
    bars = [_Bar("reused", f"{_reused(report):,} tokens", 100 * _reused(report) / whole, "reused")]
    bars += [
        _Bar(_label(row.cause), f"{row.tokens:,} tokens", 100 * row.tokens / whole, row.cause) for row in lost
    ]
    return bars


def _reused(report: Report) -> int:
    return report.reported_tokens if report.reported_tokens is not None else report.replayed_tokens


def _curve(report: Report) -> _Curve | None:
    """The curve in a 600x220 box: x by position (the multipliers are a geometric series), y 0-100%;
    the last point 40 from the right edge, room for its label centred on it."""
    if not report.curve:
        return None
    count = len(report.curve)
    dots = []
    for n, point in enumerate(report.curve):
        x = 40 + 520 * (n / max(count - 1, 1))
        y = 200 - 180 * (point.hit_rate or 0.0)
        dots.append((round(x, 1), round(y, 1), f"x{point.multiplier:g}", _percent(point.hit_rate)))
    return _Curve(" ".join(f"{x},{y}" for x, y, _, _ in dots), dots)
