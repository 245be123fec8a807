"""Per-minute hit-rate series of each scope, read from the loss rollups (traffic.LossMinute), never
from raw records: what the detection searches and what a regression's figures are computed from."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, Sum

from app.domain.changepoints import MinutePoint
from app.domain.prefill import PrefillSums
from app.traffic.models import LossMinute, MinuteRollup
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


def scope_series(scope: str, *, since: datetime, until: datetime) -> dict[ScopeKey, list[Minute]]:
    """Each group's minutes of [since, until) with diagnosed requests, in time order.

    A server's, a tenant's or the fleet's hit rate leaves out the tokens lost to prompts changing
    and the tails below one block (never reusable): a template commit is its template's regression,
    never theirs, and what is left, the reuse of what could have been reused, says whether they
    changed themselves (a capacity cut shows on all of a server's traffic, whatever its templates'
    commits did meanwhile; without the tails too, a template whose prompts all changed weighs
    nothing instead of its tails).
    """
    names = _GROUPED_BY[scope]
    rows = (
        LossMinute.objects.filter(minute__gte=since, minute__lt=until, diagnosed__gt=0)
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
        minute = _minute(row) if scope == "template" else _reusable_only(_minute(row))
        if minute.prompt_tokens > 0:
            found.setdefault(_key(scope, row), []).append(minute)
    return found


_NEVER_THE_SCOPES = ("prompt_changed", "below_block")


def _reusable_only(minute: Minute) -> Minute:
    left_out = sum(minute.lost.get(cause, 0) for cause in _NEVER_THE_SCOPES)
    lost = {cause: tokens for cause, tokens in minute.lost.items() if cause not in _NEVER_THE_SCOPES}
    return Minute(minute.minute, minute.requests, minute.prompt_tokens - left_out, minute.reused_tokens, lost)


def _key(scope: str, row: dict[str, Any]) -> ScopeKey:
    return (scope, row.get("template_id"), row.get("server_id"), row.get("tenant", ""))


def _minute(row: dict[str, Any]) -> Minute:
    lost = {cause: row[f"{cause}_"] for cause in LOST_COLUMNS if row[f"{cause}_"]}
    return Minute(row["minute"], row["requests_"], row["prompt_"], row["reused_"], lost)


def prefill_sums(key: ScopeKey, *, since: datetime, until: datetime) -> PrefillSums:
    """The TTFT-over-uncached-tokens sums of the scope's requests (a tenant's: the fleet's, the
    request rollups have no tenant)."""
    scope, template_id, server_id, _ = key
    rows = MinuteRollup.objects.filter(minute__gte=since, minute__lt=until)
    if scope == "template" and template_id is not None:
        rows = rows.filter(template_id=template_id)
    elif scope == "server" and server_id is not None:
        rows = rows.filter(server_id=server_id)
    found = rows.aggregate(
        count=Sum("prefill_count"), x=Sum("prefill_uncached_sum"), y=Sum("prefill_ttft_sum"),
        xx=Sum("prefill_uncached_squares"), xy=Sum("prefill_cross_sum"),
    )  # fmt: skip
    return PrefillSums(**{name: value or 0 for name, value in found.items()})


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
