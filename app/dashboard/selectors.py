"""Reads behind the dashboard pages."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Max, QuerySet, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.domain.hitrate import counter_increase
from app.fleet.models import Server
from app.traffic.models import KVGap, KVStream, MinuteRollup, RejectedInput, ScrapeSample
from collectors.metrics.parse import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES


@dataclass(frozen=True, slots=True)
class ServerRow:
    server: Server
    requests: int
    request_hit_rate: float | None  # cached / prompt tokens of recorded requests; None when unknown
    counter_hit_rate: float | None  # growth of the server's prefix-cache hit and query counters

    @property
    def request_hit_rate_percent(self) -> float | None:
        return None if self.request_hit_rate is None else 100 * self.request_hit_rate

    @property
    def counter_hit_rate_percent(self) -> float | None:
        return None if self.counter_hit_rate is None else 100 * self.counter_hit_rate


def fleet_overview(
    *, now: datetime, window: timedelta = timedelta(hours=1), viewer: Viewer = SEES_ALL
) -> list[ServerRow]:
    """Every registered server's requests and hit rates over the last `window` (proposed
    servers are left out: see proposed_servers).

    Two hit rates, because they come from different places: the one of recorded requests (from
    rollups) and the one of the server's own counters (from scraped /metrics).
    """
    servers = viewer.servers(Server.objects.exclude(state=Server.State.PROPOSED))
    counters = counter_hit_rates(since=now - window, until=now)
    return _rows(servers, now=now, window=window, counters=counters, viewer=viewer)


def proposed_servers(
    *, now: datetime, window: timedelta = timedelta(hours=1), viewer: Viewer = SEES_ALL
) -> list[ServerRow]:
    """Servers that ingested data named and no person registered (a typo, a span without a
    server attribute), oldest first, with their requests over the last `window`."""
    servers = viewer.servers(Server.objects.filter(state=Server.State.PROPOSED)).order_by(
        "created_at", "name"
    )
    return _rows(servers, now=now, window=window, counters={}, viewer=viewer)


def _rows(
    servers: QuerySet[Server], *, now: datetime, window: timedelta, counters: dict[int, float], viewer: Viewer
) -> list[ServerRow]:
    """Each server's requests and hit rate of the request rollups the viewer sees (a shared server's:
    of the viewer's templates only); its own counters' hit rate is the server's, whoever's traffic."""
    totals = {
        row["server_id"]: row
        for row in viewer.rollups(MinuteRollup.objects.all())
        .filter(minute__gte=now - window, minute__lt=now, server__in=servers.values("pk"))
        .values("server_id")
        .annotate(
            requests=Sum("requests"), known=Sum("cache_known_prompt_tokens"), cached=Sum("cached_tokens")
        )
    }
    rows = []
    for server in servers:
        t = totals.get(server.pk, {"requests": 0, "known": 0, "cached": 0})
        request_rate = t["cached"] / t["known"] if t["known"] else None
        rows.append(ServerRow(server, t["requests"], request_rate, counters.get(server.pk)))
    return rows


def counter_hit_rates(*, since: datetime, until: datetime) -> dict[int, float]:
    """Per server: hits over queries of its prefix-cache counters between two times (resets counted).

    Reads at most one window of raw samples of two series per engine; None-free: servers without
    queries in the window are left out.
    """
    samples = (
        ScrapeSample.objects.filter(
            series__name__in=PREFIX_CACHE_QUERIES + PREFIX_CACHE_HITS,
            scraped_at__gte=since,
            scraped_at__lt=until,
        )
        .order_by("series_id", "scraped_at")
        .values_list("server_id", "series_id", "series__name", "value")
    )
    series: dict[tuple[int, int, str], list[float]] = {}
    for server_id, series_id, name, value in samples:
        series.setdefault((server_id, series_id, name), []).append(value)
    queries: dict[int, float] = {}
    hits: dict[int, float] = {}
    for (server_id, _, name), values in series.items():
        growth = hits if name in PREFIX_CACHE_HITS else queries
        growth[server_id] = growth.get(server_id, 0.0) + counter_increase(values)
    return {server: hits.get(server, 0.0) / q for server, q in queries.items() if q > 0}


@dataclass(frozen=True, slots=True)
class CollectionRow:
    """How well Prefixscope hears one server: its pulls, its KV event stream, what it refused."""

    server: Server
    last_event_at: datetime | None
    batches_lost: int
    rejected: int


def collection_health(
    *, viewer: Viewer = SEES_ALL
) -> tuple[list[CollectionRow], list[RejectedInput], list[KVGap]]:
    """Per-server collection state, the rejection tallies by reason, and the latest gaps, of the
    servers the viewer sees."""
    last_event = dict(
        viewer.by_server(KVStream.objects.all())
        .values("server_id")
        .annotate(at=Max("last_event_at"))
        .values_list("server_id", "at")
    )
    lost = dict(
        viewer.by_server(KVGap.objects.all())
        .values("server_id")
        .annotate(n=Sum("lost"))
        .values_list("server_id", "n")
    )
    rejected = dict(
        viewer.by_server(RejectedInput.objects.all())
        .values("server_id")
        .annotate(n=Sum("count"))
        .values_list("server_id", "n")
    )
    rows = [
        CollectionRow(
            server, last_event.get(server.pk), lost.get(server.pk) or 0, rejected.get(server.pk) or 0
        )
        for server in viewer.servers(Server.objects.all())
    ]
    reasons = list(
        viewer.by_server(RejectedInput.objects.all()).select_related("server").order_by("-last_seen_at")[:50]
    )
    gaps = list(viewer.by_server(KVGap.objects.all()).select_related("server")[:50])
    return rows, reasons, gaps
