"""Reads behind the dashboard pages."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Max, Sum

from app.fleet.models import Server
from app.traffic.models import KVGap, KVStream, MinuteRollup, RejectedInput


@dataclass(frozen=True, slots=True)
class ServerRow:
    server: Server
    requests: int
    hit_rate: float | None  # cached / prompt tokens over the window; None without traffic

    @property
    def hit_rate_percent(self) -> float | None:
        return None if self.hit_rate is None else 100 * self.hit_rate


def fleet_overview(*, now: datetime, window: timedelta = timedelta(hours=1)) -> list[ServerRow]:
    """Every server with its request count and token hit rate over the last `window` (from rollups)."""
    totals = {
        row["server_id"]: row
        for row in MinuteRollup.objects.filter(minute__gte=now - window, minute__lt=now)
        .values("server_id")
        .annotate(requests=Sum("requests"), prompt=Sum("prompt_tokens"), cached=Sum("cached_tokens"))
    }
    rows = []
    for server in Server.objects.all():
        t = totals.get(server.pk, {"requests": 0, "prompt": 0, "cached": 0})
        hit_rate = t["cached"] / t["prompt"] if t["prompt"] else None
        rows.append(ServerRow(server=server, requests=t["requests"], hit_rate=hit_rate))
    return rows


@dataclass(frozen=True, slots=True)
class CollectionRow:
    """How well Prefixscope hears one server: its pulls, its KV event stream, what it refused."""

    server: Server
    last_event_at: datetime | None
    batches_lost: int
    rejected: int


def collection_health() -> tuple[list[CollectionRow], list[RejectedInput], list[KVGap]]:
    """Per-server collection state, the rejection tallies by reason, and the latest gaps."""
    last_event = dict(
        KVStream.objects.values("server_id").annotate(at=Max("last_event_at")).values_list("server_id", "at")
    )
    lost = dict(KVGap.objects.values("server_id").annotate(n=Sum("lost")).values_list("server_id", "n"))
    rejected = dict(
        RejectedInput.objects.values("server_id").annotate(n=Sum("count")).values_list("server_id", "n")
    )
    rows = [
        CollectionRow(
            server, last_event.get(server.pk), lost.get(server.pk) or 0, rejected.get(server.pk) or 0
        )
        for server in Server.objects.all()
    ]
    reasons = list(RejectedInput.objects.select_related("server").order_by("-last_seen_at")[:50])
    gaps = list(KVGap.objects.select_related("server")[:50])
    return rows, reasons, gaps
