"""What a template version did to its template's reuse once it went live, observed in the request
rollups, in the unit of its check's prediction (app/domain/templatecheck/price.py): prompt tokens an
hour prefilled again (positive: reuse lost; negative: gained).

Observed = (reused tokens per request before - after) x requests per hour after, where

- before is the template's traffic over the hour before the version went live (from the moment the
  version before it went live, when that was later: its own traffic, not the one before);
- after is its traffic from then until the next version went live, an hour at most, to the last
  whole minute at most;
- reused tokens per request are the template's hit rate (cached over prompt tokens of the requests
  that reported cached tokens) times its mean prompt tokens, as the page's prefix memory reads it:
  requests that did not report cached tokens count at the rate of those that did.

Windows are whole minutes of the minute rollups; the minute a version went live counts as after.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.domain.hitrate import RequestSums
from app.rollups.visibility import visible
from app.traffic.models import MinuteRollup

WINDOW = timedelta(hours=1)  # each side, at most
MIN_REQUESTS = 10  # on each side, and some of them reporting cached tokens: fewer is noise


@dataclass(frozen=True, slots=True)
class Live:
    """A version and the moment it went live (its deploy marker, else its first request)."""

    version_id: int
    live_at: datetime


@dataclass(frozen=True, slots=True)
class Side:
    """The template's request rollups summed over one side of a version going live."""

    since: datetime
    until: datetime
    sums: RequestSums = field(default_factory=RequestSums)

    @property
    def reused_per_request(self) -> float | None:
        """Mean reused prompt tokens per request; None with too few requests or none reporting."""
        return None if self.sums.requests < MIN_REQUESTS else self.sums.reused_per_request()

    @property
    def requests_per_hour(self) -> float:
        return self.sums.requests * 3600 / (self.until - self.since).total_seconds()


@dataclass(frozen=True, slots=True)
class Observed:
    """A version's observed effect: the template's traffic either side of its going live."""

    before: Side
    after: Side

    @property
    def tokens_per_hour(self) -> float | None:
        """Prompt tokens an hour prefilled again since the version (negative: fewer); None when either
        side had too little traffic to tell."""
        before, after = self.before.reused_per_request, self.after.reused_per_request
        if before is None or after is None:
            return None
        return (before - after) * self.after.requests_per_hour


def observed_effects(
    *, template_id: int, lives: Sequence[Live], now: datetime, viewer: Viewer = SEES_ALL
) -> dict[int, Observed]:
    """Each version's observed effect (the module's docstring), by version id, from the rollups the
    viewer may read; a version that went live in the minute under way (nothing after it yet) is absent.
    One query for all of them."""
    windows = _windows(lives, now=now)
    if not windows:
        return {}
    spans = Q()
    for before, after in windows.values():
        spans |= Q(minute__gte=before[0], minute__lt=after[1])
    rows = (
        visible(viewer, MinuteRollup.objects.filter(spans, template_id=template_id))
        .values("minute")
        .annotate(requests_=Sum("requests"), prompt_=Sum("prompt_tokens"), cached_=Sum("cached_tokens"),
                  known_=Sum("cache_known_prompt_tokens"))
    )  # fmt: skip
    minutes: dict[datetime, dict[str, Any]] = {row["minute"]: dict(row) for row in rows}
    return {
        version_id: Observed(_summed(minutes, *before), _summed(minutes, *after))
        for version_id, (before, after) in windows.items()
    }


Span = tuple[datetime, datetime]


def _windows(lives: Sequence[Live], *, now: datetime) -> dict[int, tuple[Span, Span]]:
    """Each version's (before, after) minutes, in the order the versions went live."""
    starts = sorted((_minute(live.live_at), live.version_id) for live in lives)
    last = _minute(now)
    found = {}
    for i, (start, version_id) in enumerate(starts):
        since = start - WINDOW
        if i > 0:
            since = max(since, starts[i - 1][0])
        until = min(start + WINDOW, last)
        if i + 1 < len(starts):
            until = min(until, starts[i + 1][0])
        if since < start < until:
            found[version_id] = ((since, start), (start, until))
    return found


def _summed(minutes: dict[datetime, dict[str, Any]], since: datetime, until: datetime) -> Side:
    rows = [row for at, row in minutes.items() if since <= at < until]
    sums = RequestSums(
        sum(r["requests_"] for r in rows), sum(r["prompt_"] for r in rows),
        sum(r["cached_"] for r in rows), sum(r["known_"] for r in rows),
    )  # fmt: skip
    return Side(since, until, sums)


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)
