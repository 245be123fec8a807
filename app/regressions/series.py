"""Per-minute hit-rate series of each scope, read from the loss rollups (traffic.LossMinute), never
from raw records: what the detection searches and what a regression's figures are computed from."""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, Sum

from app.domain.changepoints import MinutePoint
from app.traffic.models import LossMinute
from app.traffic.selectors import LOST_COLUMNS

ScopeKey = tuple[str, int | None, int | None, str]
"""(scope, template id, server id, tenant): what a regression is about (app.regressions.models)."""

# The columns naming each scope's groups; the fleet is one group.
_GROUPED_BY = {
    "template": ("template_id",),
    "server": ("server_id",),
    "tenant": ("tenant",),
    "fleet": (),
}


@dataclass(frozen=True, slots=True)
class Minute:
    """One minute of one scope's diagnosed requests: what was reused, and what was lost to each cause."""

    minute: datetime
    requests: int
    prompt_tokens: int
    reused_tokens: int
    lost: dict[str, int] = field(default_factory=dict)

    @property
    def point(self) -> MinutePoint:
        return MinutePoint(
            self.minute, self.requests, self.prompt_tokens, min(self.reused_tokens, self.prompt_tokens)
        )


def scope_series(
    scope: str, *, since: datetime, until: datetime, without_templates: Iterable[int] = ()
) -> dict[ScopeKey, list[Minute]]:
    """Each group's minutes of [since, until) with diagnosed requests, in time order, leaving out
    the minutes of `without_templates` (their drop is explained by their own regression)."""
    names = _GROUPED_BY[scope]
    rows = (
        LossMinute.objects.filter(minute__gte=since, minute__lt=until, diagnosed__gt=0)
        .exclude(template_id__in=list(without_templates))
        .values(*names, "minute")
        .annotate(
            requests_=Sum("diagnosed"),
            prompt_=Sum("diagnosed_prompt_tokens"),
            reused_=Sum("reused_tokens"),
            **{f"{cause}_": Sum(column) for cause, column in LOST_COLUMNS.items()},
        )
        .order_by("minute")
    )
    found: dict[ScopeKey, list[Minute]] = {}
    for row in rows:
        if row["prompt_"]:
            found.setdefault(_key(scope, row), []).append(_minute(row))
    return found


def _key(scope: str, row: dict[str, Any]) -> ScopeKey:
    return (scope, row.get("template_id"), row.get("server_id"), row.get("tenant", ""))


def _minute(row: dict[str, Any]) -> Minute:
    lost = {cause: row[f"{cause}_"] for cause in LOST_COLUMNS if row[f"{cause}_"]}
    return Minute(row["minute"], row["requests_"], row["prompt_"], row["reused_"], lost)


def version_requests(
    template_id: int, *, since: datetime, until: datetime
) -> dict[int | None, list[tuple[datetime, int]]]:
    """Per version of a template, its diagnosed requests per minute: which version took over when."""
    rows = (
        LossMinute.objects.filter(Q(template_id=template_id), minute__gte=since, minute__lt=until)
        .values("template_version_id", "minute")
        .annotate(requests_=Sum("diagnosed"))
        .order_by("minute")
    )
    found: dict[int | None, list[tuple[datetime, int]]] = {}
    for row in rows:
        found.setdefault(row["template_version_id"], []).append((row["minute"], row["requests_"]))
    return found
