"""Per-minute series of each scope, read from the rollups, never from raw records: the hit rate from
the loss rollups (traffic.LossMinute), the TTFT histograms from the request rollups
(traffic.MinuteRollup). What the detection searches and what a regression's figures come from."""

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, Sum

from app.domain.changepoints import MinutePoint
from app.domain.histogram import TTFT_BUCKETS_SECONDS, histogram_quantile
from app.domain.misses import NOT_LOSSES, Cause
from app.traffic.models import LOST_COLUMNS, LossMinute, MinuteRollup

ScopeKey = tuple[str, int | None, int | None, str]
"""(scope, template id, server id, tenant): what a regression is about (app.regressions.models)."""

# The columns naming each scope's groups; the fleet is one group.
_GROUPED_BY = {
    "template": ("template_id",),
    "template_server": ("template_id", "server_id"),
    "template_tenant": ("template_id", "tenant"),
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
    """Each group's minutes of [since, until) with diagnosed requests, in time order, each scope's
    prompt tokens those its hit rate is of (LEFT_OUT, HIT_RATE_DEFINITION).

    Every scope leaves out what no cache could have reused (new content, tails below one block): a
    longer question is no regression. A server's, a tenant's or the fleet's leaves out the tokens
    lost to prompts changing too: a template commit is its template's regression, never theirs, and
    what is left, the reuse of what could have been reused, says whether they changed themselves (a
    capacity cut shows on all of a server's traffic, whatever its templates' commits did meanwhile).
    """
    names = _GROUPED_BY[scope]
    rows = LossMinute.objects.filter(minute__gte=since, minute__lt=until, diagnosed__gt=0)
    if scope in NARROW_SCOPES:  # traffic without a template is the server's or tenant's alone
        rows = rows.filter(template__isnull=False)
    rows = (
        rows.values(*names, "minute")
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
        minute = _without(_minute(row), LEFT_OUT[scope])
        if minute.prompt_tokens > 0:
            found.setdefault(_key(scope, row), []).append(minute)
    return found


NARROW_SCOPES = ("template_server", "template_tenant")
TEMPLATE_SCOPES = ("template", *NARROW_SCOPES)
# The causes whose tokens each scope's hit rate leaves out of its prompt tokens, and the definition
# (app/domain/misses.py HIT_RATE_DEFINITIONS) its figures are stated with: one place for both.
LEFT_OUT = {
    scope: NOT_LOSSES if scope in TEMPLATE_SCOPES else NOT_LOSSES | {Cause.PROMPT_CHANGED}
    for scope in _GROUPED_BY
}
HIT_RATE_DEFINITION = {
    scope: "of_reusable" if scope in TEMPLATE_SCOPES else "of_unchanged" for scope in _GROUPED_BY
}


def added(total: Minute | None, minute: Minute) -> Minute:
    """Two scopes' same minute as one (`total` None: the minute alone)."""
    if total is None:
        return minute
    lost = {cause: total.lost.get(cause, 0) + minute.lost.get(cause, 0) for cause in total.lost | minute.lost}
    return Minute(minute.minute, total.requests + minute.requests, total.prompt_tokens + minute.prompt_tokens,
                  total.reused_tokens + minute.reused_tokens, lost)  # fmt: skip


def less(minute: Minute, part: Minute | None) -> Minute:
    """A wider scope's minute without a narrower one's traffic of the same minute."""
    if part is None:
        return minute
    lost = {cause: tokens - part.lost.get(cause, 0) for cause, tokens in minute.lost.items()}
    return Minute(minute.minute, minute.requests - part.requests, minute.prompt_tokens - part.prompt_tokens,
                  minute.reused_tokens - part.reused_tokens, lost)  # fmt: skip


def _without(minute: Minute, causes: Set[str]) -> Minute:
    left_out = sum(minute.lost.get(cause, 0) for cause in causes)
    lost = {cause: tokens for cause, tokens in minute.lost.items() if cause not in causes}
    return Minute(minute.minute, minute.requests, minute.prompt_tokens - left_out, minute.reused_tokens, lost)


def _key(scope: str, row: dict[str, Any]) -> ScopeKey:
    return (scope, row.get("template_id"), row.get("server_id"), row.get("tenant", ""))


def _minute(row: dict[str, Any]) -> Minute:
    lost = {cause: row[f"{cause}_"] for cause in LOST_COLUMNS if row[f"{cause}_"]}
    return Minute(row["minute"], row["requests_"], row["prompt_"], row["reused_"], lost)


def version_requests(
    template_id: int,
    *,
    since: datetime,
    until: datetime,
    server_id: int | None = None,
    tenant: str | None = None,
) -> dict[int | None, list[tuple[datetime, int]]]:
    """Per version of a template, its diagnosed requests per minute: which version took over when;
    on one server or for one tenant alone when given (a canary, a tenant's variant)."""
    narrowed = Q(template_id=template_id)
    if server_id is not None:
        narrowed &= Q(server_id=server_id)
    if tenant is not None:
        narrowed &= Q(tenant=tenant)
    rows = (
        LossMinute.objects.filter(narrowed, minute__gte=since, minute__lt=until)
        .values("template_version_id", "minute")
        .annotate(requests_=Sum("diagnosed"))
        .order_by("minute")
    )
    found: dict[int | None, list[tuple[datetime, int]]] = {}
    for row in rows:
        found.setdefault(row["template_version_id"], []).append((row["minute"], row["requests_"]))
    return found


TTFT_SCOPES = ("server", "template", "template_server", "fleet")
"""The scopes with a TTFT series: the request rollups have no tenant."""
_BUCKETS = len(TTFT_BUCKETS_SECONDS) + 1  # and the +Inf count


@dataclass(frozen=True, slots=True)
class TtftMinute:
    """One minute (or several thin ones pooled) of a scope's TTFTs: one source's histogram, and the
    scope's hit rate over the same requests (cached over cache-known prompt tokens)."""

    minute: datetime
    count: int
    buckets: tuple[int, ...]  # cumulative over TTFT_BUCKETS_SECONDS, then the total
    prompt_tokens: int
    cached_tokens: int

    @property
    def p90(self) -> float:
        """Seconds; a p90 in the first bucket is that bucket's bound at least (never 0)."""
        found = histogram_quantile(0.9, TTFT_BUCKETS_SECONDS, self.buckets) or TTFT_BUCKETS_SECONDS[0]
        return max(found, TTFT_BUCKETS_SECONDS[0] / 2)


@dataclass(frozen=True, slots=True)
class TtftSeries:
    source: str  # "server" (as vLLM measured it) or "client" (as the client saw it)
    minutes: list[TtftMinute]


def ttft_series(*, since: datetime, until: datetime) -> dict[ScopeKey, TtftSeries]:
    """Each TTFT scope's minutes of [since, until) with TTFTs, in time order, from one query.

    A scope's series is one source, never mixed: vLLM's own TTFT where the window has more of it
    than of the client's (it is the engine's queue and prefill, what the prefix cache moves,
    without the network's and the client's noise), else the client's.
    """
    rows = (
        MinuteRollup.objects.filter(minute__gte=since, minute__lt=until)
        .filter(Q(client_ttft_count__gt=0) | Q(server_ttft_count__gt=0))
        .order_by("minute")
        .values_list(
            "server_id", "template_id", "minute", "client_ttft_count", "client_ttft_buckets",
            "server_ttft_count", "server_ttft_buckets", "cache_known_prompt_tokens", "cached_tokens",
        )
    )  # fmt: skip
    sums: dict[ScopeKey, dict[datetime, list[Any]]] = {}
    for server_id, template_id, minute, *figures in rows:
        for key in _ttft_keys(server_id, template_id):
            _add(
                sums.setdefault(key, {}).setdefault(minute, [0, [0] * _BUCKETS, 0, [0] * _BUCKETS, 0, 0]),
                figures,
            )
    return {key: _one_source(minutes) for key, minutes in sums.items()}


def _ttft_keys(server_id: int, template_id: int | None) -> Iterable[ScopeKey]:
    yield ("server", None, server_id, "")
    yield ("fleet", None, None, "")
    if template_id is not None:
        yield ("template", template_id, None, "")
        yield ("template_server", template_id, server_id, "")


def _add(total: list[Any], figures: list[Any]) -> None:
    client_count, client_buckets, server_count, server_buckets, known, cached = figures
    for index, (count, buckets) in enumerate(
        ((client_count, client_buckets), (server_count, server_buckets))
    ):
        total[2 * index] += count
        if count:
            total[2 * index + 1] = [a + b for a, b in zip(total[2 * index + 1], buckets, strict=True)]
    total[4] += known
    total[5] += cached


def _one_source(minutes: dict[datetime, list[Any]]) -> TtftSeries:
    client = sum(sums[0] for sums in minutes.values())
    server = sum(sums[2] for sums in minutes.values())
    column = 2 if server >= client else 0
    found = [
        TtftMinute(minute, sums[column], tuple(sums[column + 1]), sums[4], sums[5])
        for minute, sums in minutes.items()
        if sums[column]
    ]
    return TtftSeries("server" if column == 2 else "client", found)


def pooled(minutes: Sequence[TtftMinute], *, at_least: int) -> list[TtftMinute]:
    """Consecutive minutes summed until each point has `at_least` TTFTs (a p90 of three requests is
    noise), each point at its first minute; a last point short of it is left out until it fills."""
    points: list[TtftMinute] = []
    current: TtftMinute | None = None
    for minute in minutes:
        current = minute if current is None else _summed(current, minute)
        if current.count >= at_least:
            points.append(current)
            current = None
    return points


def _summed(a: TtftMinute, b: TtftMinute) -> TtftMinute:
    buckets = tuple(x + y for x, y in zip(a.buckets, b.buckets, strict=True))
    return TtftMinute(
        a.minute,
        a.count + b.count,
        buckets,
        a.prompt_tokens + b.prompt_tokens,
        a.cached_tokens + b.cached_tokens,
    )
