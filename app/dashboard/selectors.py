"""Reads behind the dashboard pages."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Sum

from app.fleet.models import Server
from app.traffic.models import MinuteRollup


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
