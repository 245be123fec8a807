"""A what-if's answers as the What-if page shows them: the calibration's figures, the capacity curve
and the routing comparison as static/charts/charts.js draws them, every family of answers as table
rows, and the two charts' tables as CSV."""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from app.core.formats import percent
from app.domain.replay.calibration import Trust
from app.domain.replay.whatif import Answer, Kind, WhatIf, scaled_blocks

TRUST_SAYS = {
    Trust.GOOD: "The replay of the fleet as it was reproduces what the engines reused: "
    "read the answers as figures.",
    Trust.FAIR: "The replay is near what the engines reused: read the answers as directions, not figures.",
    Trust.POOR: "The replay does not reproduce what the engines reused: "
    "the answers below are not to be trusted.",
    Trust.UNKNOWN: "No request reported its cached tokens: the replay cannot be checked, "
    "so neither can the answers.",
}
EMPTY = {
    "block_sizes": "Not answered: no server kept the token ids of all its requests "
    "(re-cutting blocks needs them).",
    "salts": "Not answered: no request of the window was salted.",
    "server_counts": "Not answered: no server to count.",
}
TIMES = "\N{MULTIPLICATION SIGN}"
CSV_HEAD = ("answer", "factor", "blocks_per_server", "hit_rate", "saved_tokens_per_hour",
            "gpu_seconds_per_hour", "money_per_hour", "ttft_saved_ms")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Row:
    """One answer as a table row, its figures formatted; `here`: the fleet as it is today."""

    label: str
    blocks: str
    hit_rate: str
    change: str  # hit rate against today's, in points
    saved_tokens: str
    gpu_seconds: str
    money: str
    ttft_ms: str
    here: bool


@dataclass(frozen=True, slots=True)
class Calibrated:
    trust: str
    says: str
    replayed: str
    reported: str
    error: str
    exact: str
    requests: int


@dataclass(frozen=True, slots=True)
class RestartShown:
    """A server started anew in the window (a restart or a capacity cut), as replayed."""

    server: str
    at: datetime
    num_blocks: int


@dataclass(frozen=True, slots=True)
class Family:
    """A table of answers of one kind: `key` names it (its id, its EMPTY), `note` says what it covers
    when that is not the whole window."""

    key: str
    title: str
    column: str
    rows: list[Row]
    empty: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class Shown:
    """Everything the page shows of a question's answers."""

    answers: WhatIf
    restarts: list[RestartShown]
    calibration: Calibrated
    capacity: list[Row]
    restored: list[Row]
    routing: list[Row]
    families: list[Family]
    curve: dict[str, Any]
    bars: dict[str, Any]
    curve_error: str


def shown(answers: WhatIf) -> Shown:
    """The page's parts of `answers`."""
    today = answers.as_was.hit_rate
    return Shown(
        answers=answers,
        restarts=[
            RestartShown(r.server, datetime.fromtimestamp(r.at, UTC), r.num_blocks) for r in answers.restarts
        ],
        calibration=_calibrated(answers),
        capacity=[_row(a, answers, today) for a in answers.capacity],
        restored=[_row(a, answers, today) for a in answers.restored],
        routing=[_row(a, answers, today) for a in answers.routing],
        families=[
            _family("server_counts", "Server counts, in the same KV memory", "Servers", answers, today),
            _block_sizes(answers),
            _family("salts", "Salts", "Salts", answers, today),
        ],
        curve=curve_chart(answers),
        bars=routing_chart(answers),
        curve_error="—" if answers.curve_error_points is None else f"{answers.curve_error_points:.1f}",
    )


def curve_chart(answers: WhatIf) -> dict[str, Any]:
    """The capacity curve for charts.js (kind "xy", x on a log-2 scale): the one-pass curve as a
    line, the point replays as dots at their factors, today's (1x) marked, and the restore answer,
    when there is one, as a dashed level. Its legend, the cursor off the chart, reads today's (`rest`)."""
    points = {a.factor: a.hit_rate for a in answers.capacity if a.factor is not None}
    xs = sorted({p.factor for p in answers.curve} | set(points))
    along = {p.factor: p.hit_rate for p in answers.curve}
    today = answers.as_was.hit_rate
    series: list[dict[str, Any]] = [
        {"name": "curve", "label": "one-pass curve", "style": "line", "values": [along.get(x) for x in xs]},
        {"name": "points", "label": "point replays", "style": "points",
         "values": [points.get(x) for x in xs]},
        {"name": "today", "label": f"today (1{TIMES})", "style": "mark",
         "values": [today if x == 1 else None for x in xs]},
    ]  # fmt: skip
    for restored in answers.restored:
        series.append({"name": "restore", "label": restored.label, "reference": True,
                       "values": [restored.hit_rate] * len(xs)})  # fmt: skip
    return {"kind": "xy", "unit": "ratio", "xs": xs, "series": series, "x_unit": "factor", "log": 2,
            "x_label": "KV blocks per server, as a multiple of today's (log scale)",
            "y_label": "Hit rate", "rest": xs.index(1) if 1 in xs else None}  # fmt: skip


def routing_chart(answers: WhatIf) -> dict[str, Any]:
    """The routing comparison for charts.js (kind "bars"): each policy's hit rate, as recorded (the
    fleet's own routing) marked."""
    names = [_policy(a) for a in answers.routing]
    marked = [i for i, a in enumerate(answers.routing) if a.label == "as recorded"]
    rates = [a.hit_rate for a in answers.routing]
    return {"kind": "bars", "unit": "ratio", "categories": names, "marked": marked,
            "series": [{"name": "hit_rate", "label": "hit rate", "values": rates}],
            "x_label": "Routing policy", "y_label": "Hit rate"}  # fmt: skip


def as_csv(answers: WhatIf, table: str) -> str | None:
    """The capacity ("capacity": point replays, then any restore) or routing ("routing") table with
    unformatted figures; None for another table."""
    rows: Sequence[Answer]
    if table == "capacity":
        rows = (*answers.capacity, *answers.restored)
    elif table == "routing":
        rows = answers.routing
    else:
        return None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEAD)
    for a in rows:
        writer.writerow((
            a.label, "" if a.factor is None else f"{a.factor:g}", _blocks(a, answers),
            "" if a.hit_rate is None else f"{a.hit_rate:.4f}", f"{a.saved_tokens_per_hour:.0f}",
            f"{a.gpu_seconds_per_hour:.2f}", f"{a.money_per_hour:.4f}", f"{1000 * a.ttft_saved_seconds:.2f}",
        ))  # fmt: skip
    return out.getvalue()


def _calibrated(answers: WhatIf) -> Calibrated:
    c = answers.calibration
    return Calibrated(
        trust=c.trust.value,
        says=TRUST_SAYS[c.trust],
        replayed=percent(c.replayed_hit_rate),
        reported=percent(c.reported_hit_rate),
        error="—" if c.error_points is None else f"{c.error_points:+.1f}",
        exact=percent(c.exact_share),
        requests=c.requests,
    )


def _family(key: str, title: str, column: str, answers: WhatIf, today: float | None) -> Family:
    rows = [_row(a, answers, today) for a in getattr(answers, key)]
    return Family(key, title, column, rows, EMPTY[key])


def _block_sizes(answers: WhatIf) -> Family:
    """Block sizes, their changes against their own today's: with servers left out, the replay of
    the others' requests as they were. Today's block size among them, else the fleet's as it was
    (the same replay when none is left out)."""
    fleets = None if answers.block_sizes_left_out else answers.as_was.hit_rate
    today = next((a.hit_rate for a in answers.block_sizes if a.label.endswith(" (today)")), fleets)
    family = _family("block_sizes", "Block sizes, in the same KV memory", "Block size", answers, today)
    left_out = answers.block_sizes_left_out
    if not family.rows or not left_out:
        return family
    note = (
        f"{', '.join(left_out)} kept no token ids for some of {'its' if len(left_out) == 1 else 'their'}"
        " requests, and re-cutting blocks needs them: these are the other servers' requests, against"
        " their own hit rate today."
    )
    return replace(family, note=note)


def _row(answer: Answer, answers: WhatIf, today: float | None) -> Row:
    change = None if answer.hit_rate is None or today is None else 100 * (answer.hit_rate - today)
    label = answer.label.removesuffix(" (today)")  # a block size's: the row is marked instead
    if answer.kind is Kind.CAPACITY and answer.factor is not None:
        label = f"{answer.factor:g}{TIMES}"
    return Row(
        label=label,
        blocks=_blocks(answer, answers),
        hit_rate=percent(answer.hit_rate),
        change="—" if change is None else f"{change:+.1f}",
        saved_tokens=f"{answer.saved_tokens_per_hour:+,.0f}",
        gpu_seconds=f"{answer.gpu_seconds_per_hour:+,.1f}",
        money=_money(answer.money_per_hour),
        ttft_ms=f"{1000 * answer.ttft_saved_seconds:+,.1f}",
        here=answer.factor == 1 or answer.label in ("as recorded", f"{label} (today)"),
    )


def _blocks(answer: Answer, answers: WhatIf) -> str:
    """KV blocks per server at a capacity answer's factor (as vLLM counts them, its null block
    included): one figure when all are alike, else each size with its count."""
    if answer.kind is not Kind.CAPACITY or answer.factor is None:
        return ""
    factor = answer.factor
    sizes = Counter(scaled_blocks(blocks, factor) for blocks in answers.blocks_now.values())
    if len(sizes) == 1:
        return f"{next(iter(sizes)):,}"
    return ", ".join(
        f"{count} {TIMES} {size:,}" for size, count in sorted(sizes.items(), key=lambda p: -p[0])
    )


def _money(value: float) -> str:
    """Signed dollars: to the cent from a dollar up, else to a hundredth of a cent (a demo's or a
    small scope's figures are fractions of a cent an hour)."""
    sign = "-" if value < 0 else "+"
    return f"{sign}${abs(value):,.2f}" if abs(value) >= 1 or value == 0 else f"{sign}${abs(value):.4f}"


def _policy(answer: Answer) -> str:
    return "as recorded (today)" if answer.label == "as recorded" else answer.label
