"""The fleet's hit rates over windows of time, each by its definition (app/domain/misses.py
HIT_RATE_DEFINITIONS), from the rollups alone: what the Fleet page's cards and the fleet API state."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.fleet.models import Server
from app.rollups.sums import REQUEST_ROLLUPS, SERVER_ROLLUPS, windows_totals


@dataclass(frozen=True, slots=True)
class HitRates:
    """One window's hit rates of the fleet; None where nothing was counted."""

    requests: float | None  # of its recorded requests, hosted-API ones included (OF_RECORDED)
    counters: float | None  # of its servers' own prefix-cache counters (OF_COUNTERS)
    hosted: float | None  # of its hosted-API requests alone (OF_HOSTED)
    cached_tokens: int  # cached prompt tokens of the recorded requests: prefill skipped

    def by_definition(self) -> dict[str, float | None]:
        """The rates by their names in HIT_RATE_DEFINITIONS."""
        return {"recorded": self.requests, "counters": self.counters, "hosted": self.hosted}


_CACHED = {
    "cached": Sum("cached_tokens"), "known": Sum("cache_known_prompt_tokens"),
    "hosted_cached": Sum("hosted_cached_tokens"), "hosted_known": Sum("hosted_known_prompt_tokens"),
}  # fmt: skip
_COUNTED = {"hits": Sum("prefix_hits"), "queries": Sum("prefix_queries")}


def fleet_hit_rates(
    servers: QuerySet[Server], windows: list[tuple[datetime, datetime]], *, viewer: Viewer = SEES_ALL
) -> list[HitRates]:
    """The hit rates of `servers` over each [since, until) of `windows`, of the traffic `viewer`
    sees (a server's own counters: of the servers it sees). Two queries of each rollup pair in all."""
    requests = windows_totals(REQUEST_ROLLUPS, servers, windows, sums=_CACHED, viewer=viewer)
    counters = windows_totals(SERVER_ROLLUPS, servers, windows, sums=_COUNTED)
    return [
        HitRates(
            requests=_ratio(r["cached"], r["known"]),
            counters=_ratio(c["hits"], c["queries"]),
            hosted=_ratio(r["hosted_cached"], r["hosted_known"]),
            cached_tokens=r["cached"] or 0,
        )
        for r, c in zip(requests, counters, strict=True)
    ]


def _ratio(part: int | None, whole: int | None) -> float | None:
    return (part or 0) / whole if whole else None
