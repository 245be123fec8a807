"""Reads behind the Collection page: how well Prefixscope hears each server."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Max, Sum
from django.utils import timezone

from app.core.retention import kept_token_ids_since
from app.core.tenancy import SEES_ALL, Viewer
from app.fleet.models import Server
from app.traffic.models import KVGap, KVStream, RejectedInput, UndecodableSample


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


@dataclass(frozen=True, slots=True)
class SampleRow:
    """The first bytes of one undecodable KV payload or event, in hex."""

    reason: str
    seen_at: datetime
    head_hex: str


def server_collection(server: Server, *, with_samples: bool) -> tuple[list[RejectedInput], list[SampleRow]]:
    """The server's rejection tallies by source and code (the latest message of each), and, for a
    viewer allowed raw bytes (they can hold token ids), the samples of its undecodable KV events
    still inside the token retention."""
    tallies = list(RejectedInput.objects.filter(server=server).order_by("-last_seen_at"))
    if not with_samples or (cutoff := kept_token_ids_since(timezone.now())) is None:
        return tallies, []
    samples = UndecodableSample.objects.filter(server=server, seen_at__gte=cutoff).order_by(
        "reason", "-seen_at"
    )
    return tallies, [SampleRow(s.reason, s.seen_at, bytes(s.head).hex(" ")) for s in samples]
