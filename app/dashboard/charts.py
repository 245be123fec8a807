"""A page's chart of series over its window: what static/charts/charts.js draws, and the table of its
numbers under it (the Server and Template pages)."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.core.formats import percent as percent  # the pages' own, from here
from app.domain.misses import CAUSE_LABELS
from app.rollups import series as traffic_series
from app.rollups.series import Series

LABELS = {
    "hit_rate": "Requests (cached tokens reported)", "engine_hit_rate": "vLLM prefix-cache counters",
    "kv_usage": "KV cache usage", "evictions": "Blocks removed (KV events)",
    "preemptions": "Preemptions", "request_rate": "Finished (vLLM counter)",
    "recorded_rate": "Recorded by Prefixscope",
    **{f"ttft_{p} ({ttft})": p for p in ("p50", "p90", "p99") for ttft in traffic_series.TTFTS},
    **{cause.value: label for cause, label in CAUSE_LABELS.items()},
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Chart:
    slug: str
    title: str
    note: str
    unit: str
    series: list[Series]
    times: list[datetime]

    @property
    def labels(self) -> list[str]:
        return [LABELS.get(s.name, s.name) for s in self.series]

    @property
    def data(self) -> dict[str, Any]:
        """What static/charts/charts.js draws: the series API's answer, with labels."""
        return {"unit": self.unit, "times": [at.isoformat() for at in self.times],
                "series": [{"name": s.name, "label": label, "values": s.values}
                           for s, label in zip(self.series, self.labels, strict=True)]}  # fmt: skip

    @property
    def data_id(self) -> str:
        return f"{self.slug}-data"

    @property
    def rows(self) -> list[tuple[datetime, list[str]]]:
        return [
            (at, [_shown(s.values[i], self.unit) for s in self.series]) for i, at in enumerate(self.times)
        ]


def _shown(value: float | None, unit: str) -> str:
    """A table cell: a ratio in per cent, seconds to the millisecond, counts whole or to 0.01."""
    if value is None:
        return "—"
    if unit == "ratio":
        return percent(value)
    if unit == "seconds":
        return f"{value:.3f} s"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"
