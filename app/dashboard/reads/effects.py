"""A template version's effect: the template's totals over equal windows just before and after the
version went live, read from the rollups as app/dashboard/reads/templates.py reads them."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from app.core.tenancy import SEES_ALL, Viewer
from app.dashboard.reads.templates import template_totals
from app.domain.hitrate import RequestSums


@dataclass(frozen=True, slots=True)
class Effect:
    """A version's effect: the template's totals over equal windows just before and after it went live."""

    minutes: int  # of each window; shorter than asked when the version went live less than that ago
    before: RequestSums
    after: RequestSums

    @property
    def change(self) -> float | None:
        if self.before.hit_rate is None or self.after.hit_rate is None:
            return None
        return self.after.hit_rate - self.before.hit_rate


def version_effect(
    *, template_id: int, live_at: datetime, now: datetime, minutes: int = 60, viewer: Viewer = SEES_ALL
) -> Effect:
    """The template's hit rate in the `minutes` after `live_at` (to now at most) and in as many before it,
    in whole minutes: the minute it went live counts as after."""
    start = live_at.replace(second=0, microsecond=0)
    end = min(start + timedelta(minutes=minutes), now.replace(second=0, microsecond=0))
    span = max(end - start, timedelta(minutes=1))
    after = template_totals(template_id=template_id, since=start, until=start + span, viewer=viewer)
    before = template_totals(template_id=template_id, since=start - span, until=start, viewer=viewer)
    return Effect(int(span.total_seconds() // 60), before, after)
