"""The version panel of a template's page: a version the page's chart marks, its diff against the
version committed before it, and its effect (the template's hit rate over equal windows before and
after it went live, read from the rollups)."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.core.tenancy import Viewer
from app.dashboard.charts import percent
from app.dashboard.reads.effects import Effect, version_effect
from app.prompts.models import Template
from app.prompts.selectors import LiveVersion
from app.regressions.evidence import diff_rows

EFFECT_MINUTES = 60  # the equal windows before and after a version went live


def picked_version(asked: str, versions: list[LiveVersion]) -> LiveVersion | None:
    return next((v for v in versions if str(v.version.pk) == asked), None)


@dataclass(frozen=True, slots=True)
class VersionPanel:
    live: LiveVersion
    previous: LiveVersion | None  # the version committed just before it
    diff: list[Any]  # (DiffLine, what the page says of a moved line)
    effect: Effect | None  # None for a version never seen live

    @property
    def before_rate(self) -> str:
        return percent(self.effect.before.hit_rate if self.effect else None)

    @property
    def after_rate(self) -> str:
        return percent(self.effect.after.hit_rate if self.effect else None)

    @property
    def change_points(self) -> str:
        change = self.effect.change if self.effect else None
        return "no hit rate on one side" if change is None else f"{100 * change:+.1f} percentage points"


def version_panel(
    template: Template, live: LiveVersion | None, *, now: datetime, viewer: Viewer
) -> VersionPanel | None:
    if live is None:
        return None
    version = live.version
    previous = (
        template.versions.filter(committed_at__lt=version.committed_at).order_by("-committed_at").first()
    )
    effect = None
    if live.live_at is not None:
        effect = version_effect(
            template_id=template.pk, live_at=live.live_at, now=now, minutes=EFFECT_MINUTES, viewer=viewer
        )
    before = LiveVersion(previous, None, "") if previous else None
    return VersionPanel(live, before, diff_rows(version.diff), effect)
