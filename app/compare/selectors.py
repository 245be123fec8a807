"""Reads behind the Compare page and API: request records, their compatibility and TTFT slope,
and saved comparisons (app.compare.results resolves and computes them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from django.contrib.postgres.aggregates import RegrCount, RegrSlope
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.db.models.functions import Coalesce

from app.compare.models import Comparison, ComparisonSide
from app.compare.summary import PrefillSlope
from app.core.retention import kept_token_ids_since
from app.core.tenancy import SEES_ALL, Viewer
from app.domain.divergence import Compatibility, shared_leading_blocks
from app.domain.retention import keeps_token_ids
from app.fleet.models import Server
from app.fleet.selectors import UnknownModel, request_lora
from app.traffic.models import RequestRecord

DEFAULT_BLOCK_SIZE: Final = 16  # vLLM's default on GPUs, when no server says otherwise
SLOPE_WINDOW: Final = timedelta(hours=1)
SLOPE_MIN_SAMPLES: Final = 20
PREVIOUS_LOOKBACK: Final = timedelta(days=1)
PREVIOUS_CANDIDATES: Final = 1_000


@dataclass(frozen=True, slots=True)
class RecordKey:
    """A request record's key; as text ``<server id>~<arrived at, ISO 8601>~<request id>``."""

    server_id: int
    request_id: str
    arrived_at: datetime

    def __str__(self) -> str:
        return f"{self.server_id}~{self.arrived_at.isoformat()}~{self.request_id}"

    @classmethod
    def parse(cls, text: str) -> RecordKey:
        """Raises ValueError for text that is not a key."""
        server_id, arrived_at, request_id = text.split("~", 2)
        when = datetime.fromisoformat(arrived_at)
        if when.tzinfo is None or not request_id:
            raise ValueError(f"not a request key: {text!r}")
        return cls(int(server_id), request_id, when)

    @classmethod
    def of(cls, record: RequestRecord) -> RecordKey:
        return cls(record.server_id, record.request_id, record.arrived_at)


# --- request records ---------------------------------------------------------------------------


def request_record(key: RecordKey, *, viewer: Viewer = SEES_ALL) -> RequestRecord | None:
    """The record with this key, its server and template joined, or None (also when the viewer does
    not see it)."""
    return (
        viewer.traffic(RequestRecord.objects.all())
        .select_related("server", "template", "template_version")
        .filter(server_id=key.server_id, request_id=key.request_id, arrived_at=key.arrived_at)
        .first()
    )


def previous_request_key(key: RecordKey, *, viewer: Viewer = SEES_ALL) -> RecordKey | None:
    """The earlier request vLLM could best have reused from when it served ``key``'s request.

    vLLM reuses a cached block only on the server that holds it, and only for a request under
    the same cache salt and the same model name (the base model, or one LoRA adapter). Of the
    requests that arrived strictly before it on its server under its salt and model, this is the
    one whose block hashes share the longest leading run with its own, and the latest of those
    that share as much (the latest of all when no hashes are recorded). It looks back
    PREVIOUS_LOOKBACK and at the latest PREVIOUS_CANDIDATES requests, so that a busy server's
    history is not read whole. None when there is none, or no record with that key; of the records
    the viewer sees.
    """
    record = (
        viewer.traffic(RequestRecord.objects.all())
        .filter(server_id=key.server_id, request_id=key.request_id, arrived_at=key.arrived_at)
        .only("model", "salt_hash", "block_hashes")
        .first()
    )
    if record is None:
        return None
    candidates = (
        viewer.traffic(RequestRecord.objects.all())
        .filter(
            server_id=key.server_id,
            model=record.model,
            salt_hash=record.salt_hash,
            arrived_at__lt=key.arrived_at,
            arrived_at__gte=key.arrived_at - PREVIOUS_LOOKBACK,
        )
        .order_by("-arrived_at", "-request_id")
        .values_list("request_id", "arrived_at", "block_hashes")[:PREVIOUS_CANDIDATES]
    )
    best = max(
        candidates,
        key=lambda row: (shared_leading_blocks(row[2], record.block_hashes), row[1]),
        default=None,
    )
    return None if best is None else RecordKey(key.server_id, best[0], best[1])


@dataclass(frozen=True, slots=True)
class ExplorerRow:
    record: RequestRecord
    key: str
    has_tokens: bool


def recent_requests(
    *,
    template_id: int | None = None,
    server_id: int | None = None,
    limit: int = 50,
    viewer: Viewer = SEES_ALL,
) -> list[ExplorerRow]:
    """The latest request records the viewer sees, newest first, without their token ids or hashes
    (the explorer)."""
    records: QuerySet[RequestRecord] = (
        viewer.traffic(RequestRecord.objects.all())
        .select_related("server", "template", "template_version")
        .defer("token_ids", "block_hashes")
        .annotate(has_tokens=Q(token_ids__isnull=False))
        .order_by("-arrived_at")
    )
    if template_id is not None:
        records = records.filter(template_id=template_id)
    if server_id is not None:
        records = records.filter(server_id=server_id)
    return [ExplorerRow(r, str(RecordKey.of(r)), r.has_tokens) for r in records[:limit]]  # type: ignore[attr-defined]


def record_compatibility(record: RequestRecord) -> Compatibility:
    """What, besides its tokens, decided a recorded request's cache reuse.

    A request naming one of the LoRA adapters its server lists asked for that adapter (vLLM
    serves adapters under their own model names), loaded from the path the server says; a model
    its server does not list is taken as another model. The tokenizer is the base model's own.
    The KV-cache dtype is not recorded.
    """
    server = record.server
    try:
        lora = request_lora(server, record.model)
        base = server.model or record.model
    except UnknownModel:  # not a model the server lists: taken as a model of its own
        lora, base = None, record.model
    return Compatibility(
        model=base,
        tokenizer=base or None,
        lora_adapter=lora.name if lora else None,
        lora_path=lora.path if lora else None,
        template=record.template.name if record.template else None,
        template_version=record.template_version.commit_sha if record.template_version else None,
        tenant_salt=record.salt_hash or None,
        kv_cache_dtype=None,
        hash_algo=record.server.hash_algo or None,
    )


def prefill_slope(server: Server | None, *, now: datetime) -> PrefillSlope:
    """The slope of TTFT over uncached prompt tokens on ``server`` in the last hour, and the
    number of requests behind it; unmeasured (None) without a server, or when fewer than
    SLOPE_MIN_SAMPLES requests had a TTFT.

    Each request's TTFT is vLLM's own where its span gave it, else the client's: the two differ
    by the network and the gateway, about the same for every request, which the slope leaves out.
    """
    if server is None:
        return PrefillSlope(server_name="", seconds_per_token=None, samples=0)
    figures = (
        RequestRecord.objects.filter(server=server, arrived_at__gte=now - SLOPE_WINDOW, arrived_at__lte=now)
        .annotate(
            ttft=Coalesce("server_ttft_seconds", "client_ttft_seconds"),
            uncached=F("prompt_tokens") - Coalesce("cached_tokens", 0),
        )
        .aggregate(slope=RegrSlope("ttft", "uncached"), samples=RegrCount("ttft", "uncached"))
    )
    samples = int(figures["samples"] or 0)
    slope = figures["slope"] if samples >= SLOPE_MIN_SAMPLES else None
    return PrefillSlope(server_name=server.name, seconds_per_token=slope, samples=samples)


# --- comparisons -------------------------------------------------------------------------------


def comparison(slug: str, *, viewer: Viewer = SEES_ALL, user_id: int | None = None) -> Comparison:
    """The comparison with this slug, its sides prefetched. Raises Comparison.DoesNotExist, also for
    one the viewer may not see (visible_comparisons)."""
    return visible_comparisons(viewer, user_id=user_id).prefetch_related("sides__server").get(slug=slug)


def visible_comparisons(viewer: Viewer, *, user_id: int | None) -> QuerySet[Comparison]:
    """The comparisons a viewer sees: their own, and those of two recorded requests they see both of
    (a regression's evidence pair, a colleague's link). A pasted prompt is its author's alone; a
    comparison whose records retention dropped, its author's and admins'."""
    if viewer.sees_all:
        return Comparison.objects.all()
    seen_record = viewer.traffic(RequestRecord.objects.all()).filter(
        server_id=OuterRef("server_id"), request_id=OuterRef("request_id"), arrived_at=OuterRef("arrived_at")
    )
    unseen_side = ComparisonSide.objects.filter(comparison=OuterRef("pk")).exclude(
        Q(source=ComparisonSide.Source.RECORD) & Q(Exists(seen_record))
    )
    return Comparison.objects.filter(Q(created_by_id=user_id) | ~Exists(unseen_side))


def comparison_sides(comparison: Comparison) -> tuple[ComparisonSide, ComparisonSide]:
    """A comparison's side a and side b (from the prefetched sides)."""
    by_letter = {side.side: side for side in comparison.sides.all()}
    return by_letter["a"], by_letter["b"]


def recent_comparisons(
    *, limit: int = 10, viewer: Viewer = SEES_ALL, user_id: int | None = None
) -> QuerySet[Comparison]:
    return visible_comparisons(viewer, user_id=user_id).prefetch_related("sides__server")[:limit]


def tokens_kept(created_at: datetime, *, now: datetime) -> bool:
    """Whether a pasted prompt's token ids stored at ``created_at`` may still be read."""
    return keeps_token_ids(created_at, kept_token_ids_since(now))


def block_size_for(*servers: Server | None) -> int:
    """The first of the servers' block sizes (b's server first), else DEFAULT_BLOCK_SIZE."""
    return next((s.block_size for s in servers if s is not None and s.block_size), DEFAULT_BLOCK_SIZE)
