"""What a regression's page draws: its scope's hit rate per minute around the change (from the loss
rollups, as the detection read them: app/regressions/series.py), with the change point, the rate
before and after as reference lines and the template's versions marked where they went live; and
for a capacity drop, the server's capacity before and after it (its KV blocks from vLLM's
cache_config_info, its evictions per minute from the server rollups, what it holds now).

Every chart's numbers are a table on the page and a CSV (`?chart=<slug>&format=csv`), as on the
dashboard's pages (templates/dashboard/_chart.html draws them; static/charts/charts.js the chart).
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.urls import reverse

from app.prompts.models import VersionCheck
from app.prompts.selectors import LiveVersion, live_versions
from app.regressions.models import Regression
from app.regressions.series import Minute, scope_series
from app.rollups.series import Series
from app.traffic.kv_blocks import kv_blocks
from app.traffic.models import ServerMinute
from app.traffic.residency import ResidentShare, resident_shares

BEFORE = timedelta(hours=1)  # drawn before the change
AFTER_AT_MOST = timedelta(hours=6)  # drawn after it: to its resolution or now, this at most
BEFORE_AT_LEAST = timedelta(minutes=10)  # drawn before it, when the scope's traffic began later


@dataclass(frozen=True, slots=True)
class ChartWindow:
    """The minutes drawn: [since, until), whole minutes, the change inside."""

    since: datetime
    until: datetime
    changed_at: datetime

    @property
    def minutes(self) -> list[datetime]:
        count = int((self.until - self.since).total_seconds()) // 60
        return [self.since + timedelta(minutes=i) for i in range(count)]


def chart_window(regression: Regression, *, now: datetime) -> tuple[ChartWindow, list[Minute]]:
    """An hour before the change to its resolution (an open one's: now), six hours after it at
    most, and always the change's own minute and the next; a scope whose traffic began later than
    an hour before is drawn from its first minute (ten minutes before the change at least), not
    from an empty hour. With the scope's minutes in it, from the loss rollups."""
    changed_at = _floor(regression.changed_at)
    # An open one's to the last whole minute: the minute under way is not rolled up in full.
    end = _ceil(regression.resolved_at) if regression.resolved_at else _floor(now)
    until = max(min(end, changed_at + AFTER_AT_MOST), changed_at + timedelta(minutes=2))
    key = (regression.scope, regression.template_id, regression.server_id, regression.tenant)
    found = scope_series(regression.scope, since=changed_at - BEFORE, until=until).get(key, [])
    first = found[0].minute if found else changed_at
    since = max(changed_at - BEFORE, min(first, changed_at - BEFORE_AT_LEAST))
    return ChartWindow(since, until, changed_at), [m for m in found if m.minute >= since]


@dataclass(frozen=True, slots=True)
class RegressionChart:
    """One chart of the page, in the shape templates/dashboard/_chart.html and charts.js read."""

    slug: str
    title: str
    note: str
    unit: str
    times: list[datetime]
    series: list[Series]
    labels: list[str]
    references: frozenset[str] = frozenset()  # the series drawn dashed, as levels
    markers: tuple[dict[str, str], ...] = ()

    @property
    def data(self) -> dict[str, Any]:
        """What static/charts/charts.js draws: the series API's answer, with labels and markers."""
        series = [{"name": s.name, "label": label, "values": s.values, "reference": s.name in self.references}
                  for s, label in zip(self.series, self.labels, strict=True)]  # fmt: skip
        times = [at.isoformat() for at in self.times]
        return {"unit": self.unit, "times": times, "series": series, "markers": list(self.markers)}

    @property
    def data_id(self) -> str:
        return f"{self.slug}-data"

    @property
    def rows(self) -> list[tuple[datetime, list[str]]]:
        return [
            (at, [_shown(s.values[i], self.unit) for s in self.series]) for i, at in enumerate(self.times)
        ]


def hit_rate_chart(regression: Regression, window: ChartWindow, found: list[Minute]) -> RegressionChart:
    """The scope's hit rate per minute over the window (None in a minute without diagnosed
    requests), the rate before and after the change as the regression states them, each over its
    side of the change; marked at the change and where the template's versions went live."""
    points = {m.minute: m.point for m in found}
    rates = [_rate(points.get(at)) for at in window.minutes]
    before = [regression.rate_before if at < window.changed_at else None for at in window.minutes]
    after = [regression.rate_after if at >= window.changed_at else None for at in window.minutes]
    return RegressionChart(
        "hit-rate", "Hit rate per minute",
        f"{regression.hit_rate_definition.capitalize()}, from the per-minute loss rollups the detection "
        "read; dashed: the rate before and after",
        "ratio", window.minutes,
        [Series("hit_rate", rates), Series("rate_before", before), Series("rate_after", after)],
        ["Hit rate", "Before the change", "After the change"],
        frozenset({"rate_before", "rate_after"}), markers(regression, window),
    )  # fmt: skip


def _rate(point: Any) -> float | None:
    return None if point is None or not point.prompt_tokens else point.reused_tokens / point.prompt_tokens


def markers(regression: Regression, window: ChartWindow) -> tuple[dict[str, str], ...]:
    """The change point, then each of the template's versions that went live in the window (the
    suspect named so), each a link: the change to the page's figures, a version to its panel on
    the template's page."""
    change = {"at": regression.changed_at.isoformat(), "id": "change", "kind": "change", "href": "#figures",
              "label": f"Change point {regression.changed_at:%Y-%m-%d %H:%M} UTC"}  # fmt: skip
    if regression.template_id is None:
        return (change,)
    live = [v for v in live_versions(regression.template_id)
            if v.live_at is not None and window.since <= v.live_at < window.until]  # fmt: skip
    return (change, *(_version_marker(v, regression) for v in live))


def _version_marker(live: LiveVersion, regression: Regression) -> dict[str, str]:
    version = live.version
    assert live.live_at is not None and regression.template_id is not None
    suspect = " (the suspect)" if version.pk == regression.suspect_version_id else ""
    href = reverse("dashboard:template-detail", args=[regression.template_id]) + f"?version={version.pk}"
    label = f"{version.commit_sha[:7]}{suspect} live {live.live_at:%Y-%m-%d %H:%M} UTC ({live.source})"
    return {"at": live.live_at.isoformat(), "label": label, "href": href, "id": str(version.pk)}


@dataclass(frozen=True, slots=True)
class Side:
    """A server's capacity on one side of the change."""

    kv_blocks: int | None  # of one engine, as vLLM's cache_config_info said last on this side
    evictions: int  # blocks removed, from the server minute rollups
    minutes: int  # server minutes rolled up on this side

    @property
    def evictions_per_minute(self) -> float | None:
        return self.evictions / self.minutes if self.minutes else None


@dataclass(frozen=True, slots=True)
class Capacity:
    before: Side
    after: Side
    resident: ResidentShare  # what the block index holds now
    chart: RegressionChart

    @property
    def kv_change(self) -> float | None:
        """The KV blocks after over before, when both are known."""
        before, after = self.before.kv_blocks, self.after.kv_blocks
        return after / before if before and after is not None else None


def capacity(regression: Regression, window: ChartWindow) -> Capacity | None:
    """A capacity drop's server before and after the change; None for any other regression."""
    if regression.kind != Regression.Kind.CAPACITY or regression.server is None:
        return None
    server = regression.server
    minutes = dict(
        ServerMinute.objects.filter(server=server, minute__gte=window.since, minute__lt=window.until)
        .values_list("minute", "evictions")
    )  # fmt: skip
    sides = [
        Side(
            kv_blocks(server, since=since, until=until),
            sum(v for at, v in minutes.items() if since <= at < until),
            sum(1 for at in minutes if since <= at < until),
        )
        for since, until in ((window.since, window.changed_at), (window.changed_at, window.until))
    ]
    chart = _evictions_chart(regression, window, minutes, sides)
    return Capacity(sides[0], sides[1], resident_shares([server])[server.pk], chart)


def _evictions_chart(
    regression: Regression, window: ChartWindow, minutes: dict[datetime, int], sides: list[Side]
) -> RegressionChart:
    """Blocks the server's KV events removed per minute (None: no rollup for the minute), and each
    side's mean as a level."""
    values: list[float | None] = [None if at not in minutes else float(minutes[at]) for at in window.minutes]
    levels = [
        [sides[0].evictions_per_minute if at < window.changed_at else None for at in window.minutes],
        [sides[1].evictions_per_minute if at >= window.changed_at else None for at in window.minutes],
    ]
    return RegressionChart(
        "evictions", "Evictions per minute",
        "Blocks removed from the server's prefix cache (its KV events), from the server minute rollups; "
        "dashed: the mean per minute before and after",
        "count", window.minutes,
        [Series("evictions", values), Series("mean_before", levels[0]), Series("mean_after", levels[1])],
        ["Blocks removed", "Mean before", "Mean after"],
        frozenset({"mean_before", "mean_after"}), markers(regression, window),
    )  # fmt: skip


def _shown(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "ratio":
        return f"{100 * value:.1f} %"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def _floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def _ceil(moment: datetime) -> datetime:
    floor = _floor(moment)
    return floor if floor == moment else floor + timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the template check of the suspect version predicted when it was imported, before its
    traffic arrived; `href` opens the version on its template's page."""

    check: VersionCheck
    href: str

    @property
    def tokens_per_hour(self) -> str:
        value = self.check.predicted_tokens_per_hour
        return "" if value is None else f"{value:+,.0f}"

    @property
    def verdict(self) -> str:
        return {"error": "could not run"}.get(self.check.verdict, self.check.verdict)


def prediction(regression: Regression) -> Prediction | None:
    """The suspect version's priced check; None without a suspect, a check, or a price."""
    version = regression.suspect_version
    if version is None:
        return None
    check = VersionCheck.objects.filter(version=version, predicted_tokens_per_hour__isnull=False).first()
    if check is None:
        return None
    href = reverse("dashboard:template-detail", args=[version.template_id]) + f"?version={version.pk}"
    return Prediction(check, f"{href}#version-row-{version.pk}")
