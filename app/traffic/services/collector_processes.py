"""What collector processes hold in memory, written where /metrics can read it."""

from datetime import datetime

from app.traffic.models import CollectorProcess


def report_collector_process(
    *, kind: str, name: str, queue_depth: int, spill_bytes: int = 0, now: datetime
) -> None:
    """Save one process's in-memory figures (one row per kind and name, overwritten)."""
    CollectorProcess.objects.update_or_create(
        kind=kind,
        name=name[:200],
        defaults={"reported_at": now, "queue_depth": queue_depth, "spill_bytes": spill_bytes},
    )
