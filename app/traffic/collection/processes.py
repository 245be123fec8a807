"""What collector processes hold in memory, written where /metrics can read it."""

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from app.traffic.models import CollectorProcess

# A process not heard from in a day is gone for good (a host renamed, scaled down): its rows are deleted.
FORGOTTEN_AFTER = timedelta(days=1)


def this_process() -> str:
    """host:pid, the identity a process reports under (the KV leases' connections name it so too)."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class LeaseCounts:
    """A KV subscriber's leases: held now, and taken, lost and given up since it started."""

    held: int = 0
    taken: int = 0
    lost: int = 0
    released: int = 0


def report_collector_process(
    *,
    kind: str,
    name: str,
    queue_depth: int,
    now: datetime,
    started_at: datetime | None = None,
    process: str = "",
    spill_bytes: int = 0,
    leases: LeaseCounts | None = None,
) -> None:
    """Save one process's in-memory figures (one row per kind, name and process, overwritten), and
    delete the rows of processes silent for FORGOTTEN_AFTER (a handful of rows: one cheap DELETE)."""
    leases = leases or LeaseCounts()
    figures: dict[str, Any] = {
        "reported_at": now,
        "queue_depth": queue_depth,
        "spill_bytes": spill_bytes,
        "leases_held": leases.held,
        "leases_taken": leases.taken,
        "leases_lost": leases.lost,
        "leases_released": leases.released,
    }
    if started_at is not None:
        figures["started_at"] = started_at
    CollectorProcess.objects.update_or_create(
        kind=kind,
        name=name[:200],
        process=(process or this_process())[:100],
        defaults=figures,
        create_defaults={"started_at": now, **figures},
    )
    CollectorProcess.objects.filter(reported_at__lt=now - FORGOTTEN_AFTER).delete()


def forget_collector_process(*, kind: str, name: str, process: str = "") -> None:
    """A process that stops says so: its rows go at once instead of looking silent."""
    CollectorProcess.objects.filter(
        kind=kind, name=name[:200], process=(process or this_process())[:100]
    ).delete()
