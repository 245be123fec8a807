"""Reads behind the Fleet page: each server's row over the window (state, hit rates, TTFT, KV usage,
evictions, its KV event stream's health), the sparklines' hit rates, the headline cards and the
proposed servers. Rollups only, never raw samples, events or records."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Aggregate, Count, Max, Q, QuerySet, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.domain.histogram import TTFT_BUCKETS_SECONDS, histogram_quantile
from app.domain.misses import is_loss, reusable_hit_rate
from app.fleet.models import Server
from app.regressions.models import Regression
from app.rollups.hitrates import HitRates, fleet_hit_rates
from app.rollups.sums import (
    LOSS_ROLLUPS,
    REQUEST_ROLLUPS,
    SERVER_ROLLUPS,
    window_sums,
)
from app.traffic.models import LOST_COLUMNS, KVGap, KVStream

STALE_AFTER_PULLS = 3
"""An active server none of whose last this many pulls happened (the scheduler or worker away) is stale."""


def server_state(server: Server, *, now: datetime) -> str:
    """up, stale, down (its last pull failed), proposed or disabled."""
    if server.state != Server.State.ACTIVE:
        return str(server.state)
    late = now - STALE_AFTER_PULLS * server.scrape_interval_timedelta
    return "up" if server.last_scraped_at is not None and server.last_scraped_at >= late else "stale"


@dataclass(frozen=True, slots=True)
class ServerRow:
    """One server's line on the Fleet page over the page's window."""

    server: Server
    state: str  # server_state
    requests: int
    request_hit_rate: float | None  # cached / prompt tokens of recorded requests; None when unknown
    counter_hit_rate: float | None = None  # growth of the server's prefix-cache hit and query counters
    ttft: tuple[float | None, float | None, float | None] = (None, None, None)  # vLLM's p50, p90, p99
    kv_usage: float | None = None  # mean of the samples
    kv_usage_max: float | None = None
    evictions_per_minute: float | None = None  # None: no KV event stream heard from
    preemptions_per_minute: float | None = None  # None: not pulled in the window
    last_event_age: float | None = None  # seconds since its KV event stream's last event
    gaps: int = 0  # KV-event gaps detected in the window
    lost_batches: int = 0  # of them, batches neither received nor replayed
    spark: list[float | None] = field(default_factory=list)  # counter hit rate per bucket of the window

    @property
    def request_hit_rate_percent(self) -> float | None:
        return None if self.request_hit_rate is None else 100 * self.request_hit_rate

    @property
    def counter_hit_rate_percent(self) -> float | None:
        return None if self.counter_hit_rate is None else 100 * self.counter_hit_rate

    @property
    def ttft_shown(self) -> list[str]:
        return [_seconds(q) for q in self.ttft]

    @property
    def event_age_shown(self) -> str:
        age = self.last_event_age
        if age is None:
            return ""
        return f"{age:.0f} s" if age < 120 else f"{age / 60:.0f} min" if age < 7200 else f"{age / 3600:.0f} h"


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{1000 * value:.0f} ms" if value < 1 else f"{value:.2f} s"


def _age(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else max(0.0, (now - at).total_seconds())


def fleet_overview(
    *,
    servers: QuerySet[Server],
    now: datetime,
    since: datetime,
    until: datetime,
    bucket: int,
    viewer: Viewer = SEES_ALL,
) -> list[ServerRow]:
    """Each of `servers` over [since, until) (whole minutes): its state, hit rates (its recorded
    requests', its own counters' and those per `bucket` seconds for a sparkline), vLLM's TTFT quantiles,
    KV usage, evictions and preemptions per minute, and its KV event stream's health.

    Read from the rollups alone (hours for the whole hours of the window, minutes at its edges), never
    from raw samples, events or records: the current minute shows once rolled up (within a minute).
    """
    servers = servers.order_by("name")
    requests = _requests(servers, since=since, until=until, viewer=viewer)
    readings = window_sums(
        SERVER_ROLLUPS,
        servers,
        since=since,
        until=until,
        sums=_READINGS,
    )
    sparks = hit_rate_sparks(servers, since=since, until=until, bucket=bucket)
    streams = _streams(servers, since=since)
    minutes = (until - since).total_seconds() / 60
    rows = []
    for server in servers:
        request = requests.get(server.pk, {})
        known = request.get("known") or 0
        found = readings.get(server.pk, {})
        stream = streams.get(server.pk, {})
        rows.append(
            ServerRow(
                server, server_state(server, now=now), request.get("requests") or 0,
                (request.get("cached") or 0) / known if known else None,
                **_reading_cells(found, minutes, heard=bool(stream)),
                last_event_age=_age(stream.get("last_event_at"), now), gaps=stream.get("gaps", 0),
                lost_batches=stream.get("lost", 0), spark=sparks.get(server.pk, []),
            )
        )  # fmt: skip
    return rows


_TTFT_SUMS = {f"ttft_{i}": Sum(f"ttft_buckets__{i}") for i in range(len(TTFT_BUCKETS_SECONDS) + 1)}
_READINGS: dict[str, Aggregate] = {
    "scrapes": Sum("scrapes"), "queries": Sum("prefix_queries"), "hits": Sum("prefix_hits"),
    "preemptions": Sum("preemptions"), "usage_sum": Sum("kv_usage_sum"), "usage_n": Sum("kv_usage_samples"),
    "max_usage": Max("kv_usage_max"), "evictions": Sum("evictions"), **_TTFT_SUMS,
}  # fmt: skip


def _reading_cells(found: dict[str, Any], minutes: float, *, heard: bool) -> dict[str, Any]:
    """A server's readings over the window as ServerRow's fields (None where nothing was measured)."""
    queries, usage_n = found.get("queries") or 0, found.get("usage_n") or 0
    counts = [int(found.get(f"ttft_{i}") or 0) for i in range(len(TTFT_BUCKETS_SECONDS) + 1)]
    quantiles = tuple(histogram_quantile(q, TTFT_BUCKETS_SECONDS, counts) for q in (0.5, 0.9, 0.99))
    pulled = bool(found.get("scrapes"))
    return {
        "counter_hit_rate": (found.get("hits") or 0) / queries if queries else None,
        "ttft": quantiles, "kv_usage": found["usage_sum"] / usage_n if usage_n else None,
        "kv_usage_max": found.get("max_usage"),
        "evictions_per_minute": (found.get("evictions") or 0) / minutes if heard else None,
        "preemptions_per_minute": (found.get("preemptions") or 0) / minutes if pulled else None,
    }  # fmt: skip


def _requests(
    servers: QuerySet[Server], *, since: datetime, until: datetime, viewer: Viewer
) -> dict[Any, dict[str, Any]]:
    sums: dict[str, Aggregate] = {
        "requests": Sum("requests"), "known": Sum("cache_known_prompt_tokens"), "cached": Sum("cached_tokens")
    }  # fmt: skip
    return window_sums(REQUEST_ROLLUPS, servers, since=since, until=until, sums=sums, viewer=viewer)


def _streams(servers: QuerySet[Server], *, since: datetime) -> dict[int, dict[str, Any]]:
    """Per server with a KV event stream: its last event, and the gaps detected since `since`."""
    found: dict[int, dict[str, Any]] = {}
    for server_id, at in (
        KVStream.objects.filter(server__in=servers.values("pk"))
        .values("server_id").annotate(at=Max("last_event_at")).values_list("server_id", "at")
    ):  # fmt: skip
        found[server_id] = {"last_event_at": at, "gaps": 0, "lost": 0}
    gaps = (
        KVGap.objects.filter(server__in=servers.values("pk"), detected_at__gte=since)
        .values("server_id").annotate(n=Count("pk"), lost=Sum("lost"))
    )  # fmt: skip
    for row in gaps:
        found.setdefault(row["server_id"], {"last_event_at": None})
        found[row["server_id"]] |= {"gaps": row["n"], "lost": row["lost"] or 0}
    return found


# Each row's bucket as its number from the window's start (no timestamps to convert: a week of a fleet's
# hours is thousands of rows), and the ratio taken in PostgreSQL.
_SPARK_SQL = """
SELECT server_id, floor((extract(epoch FROM {time}) - %(since)s) / %(bucket)s)::int AS i,
       sum(prefix_hits)::float8 / nullif(sum(prefix_queries), 0)
FROM {table} WHERE server_id = ANY(%(ids)s) AND {time} >= %(start)s AND {time} < %(until)s
GROUP BY 1, 2
"""


def hit_rate_sparks(
    servers: QuerySet[Server], *, since: datetime, until: datetime, bucket: int
) -> dict[int, list[float | None]]:
    """Per server, its counters' hit rate per bucket of [since, until) (bucket-aligned), None where
    nothing was queried; read from the server hours when the bucket is whole hours, else the minutes."""
    hours = bucket % 3600 == 0
    sql = _SPARK_SQL.format(
        table="traffic_serverhour" if hours else "traffic_serverminute", time="hour" if hours else "minute"
    )
    ids = list(servers.values_list("pk", flat=True))
    count = int((until - since).total_seconds()) // bucket
    found: dict[int, list[float | None]] = {pk: [None] * count for pk in ids}
    params: dict[str, Any] = {
        "ids": ids,
        "bucket": bucket,
        "since": since.timestamp(),
        "start": since,
        "until": until,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for server_id, i, rate in cursor.fetchall():
            if 0 <= i < count:
                found[server_id][i] = rate
    return found


@dataclass(frozen=True, slots=True)
class Headline:
    now: HitRates  # the last NOW_MINUTES minutes
    hour: HitRates
    day: HitRates
    window: HitRates  # over [since, until); its `hosted` the hosted-API requests' own (OF_HOSTED)
    saved_tokens: int  # cached prompt tokens of the recorded requests in the window: prefill skipped
    lost_tokens: dict[str, int]  # reusable prompt tokens of the diagnosed requests not reused, per cause
    never_reusable: dict[str, int]  # their tokens no cache could reuse (new content ...), per cause
    reusable_rate: float | None  # the diagnosed requests' hit rate of reusable tokens (OF_REUSABLE)
    gateway_cache_answers: int  # requests a gateway answered from its semantic cache, in the window
    open_regressions: int
    acknowledged_regressions: int  # acknowledged or muted: still there, someone is on it

    @property
    def lost_total(self) -> int:
        return sum(self.lost_tokens.values())


NOW_MINUTES = 5
# Beside the causes' sums, apart from their names.
_PROMPT, _REUSED, _GATEWAY = "prompt_tokens_", "reused_tokens_", "gateway_cache_"


def fleet_headline(
    *, servers: QuerySet[Server], now: datetime, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> Headline:
    """The Fleet page's cards over `servers`: hit rates now, over the last hour and day; prompt tokens
    saved and lost (by cause) over [since, until); regressions not resolved (the fleet's and tenants'
    too: they are nobody's server). Rollups only."""
    minute = now.replace(second=0, microsecond=0)
    periods = [minute - timedelta(minutes=NOW_MINUTES - 1), now - timedelta(hours=1), now - timedelta(days=1)]
    windows = [*((start, now) for start in periods), (since, until)]
    rates = fleet_hit_rates(servers, windows, viewer=viewer)
    lost_sums: dict[str, Aggregate] = {cause: Sum(column) for cause, column in LOST_COLUMNS.items()}
    lost_sums |= {_PROMPT: Sum("diagnosed_prompt_tokens"), _REUSED: Sum("reused_tokens"),
                  _GATEWAY: Sum("gateway_cache_hits")}  # fmt: skip
    lost = window_sums(
        LOSS_ROLLUPS,
        servers,
        since=since,
        until=until,
        by="",
        sums=lost_sums,
        viewer=viewer,
    )[""]
    prompt, reused = lost.pop(_PROMPT) or 0, lost.pop(_REUSED) or 0
    gateway = lost.pop(_GATEWAY) or 0
    by_cause = {cause: tokens for cause, tokens in lost.items() if tokens}
    regressions = viewer.regressions(
        Regression.objects.filter(Q(server__isnull=True) | Q(server__in=servers.values("pk")))
    )
    states = dict(regressions.values("state").annotate(n=Count("pk")).values_list("state", "n"))
    return Headline(
        rates[0], rates[1], rates[2], rates[3], saved_tokens=rates[3].cached_tokens,
        lost_tokens={cause: tokens for cause, tokens in by_cause.items() if is_loss(cause)},
        never_reusable={cause: tokens for cause, tokens in by_cause.items() if not is_loss(cause)},
        reusable_rate=reusable_hit_rate(prompt_tokens=prompt, reused_tokens=reused, by_cause=by_cause),
        gateway_cache_answers=gateway, open_regressions=states.get(Regression.State.OPEN, 0),
        acknowledged_regressions=states.get(Regression.State.ACKNOWLEDGED, 0)
        + states.get(Regression.State.MUTED, 0),
    )  # fmt: skip


def proposed_servers(
    *, now: datetime, window: timedelta = timedelta(hours=1), viewer: Viewer = SEES_ALL
) -> list[ServerRow]:
    """Servers that ingested data named and no person registered (a typo, a span without a
    server attribute), oldest first, with their requests over the last `window`."""
    servers = viewer.servers(Server.objects.filter(state=Server.State.PROPOSED)).order_by(
        "created_at", "name"
    )
    requests = _requests(servers, since=now - window, until=now, viewer=viewer)
    return [
        ServerRow(server, "proposed", requests.get(server.pk, {}).get("requests") or 0, None)
        for server in servers
    ]
