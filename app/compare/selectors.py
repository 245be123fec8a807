"""Reads behind the Compare page and API: request records, their compatibility and TTFT slope,
and saved comparisons (app.compare.results resolves and computes them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from django.conf import settings
from django.contrib.postgres.aggregates import RegrCount, RegrSlope
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Coalesce

from app.compare.models import Comparison, ComparisonSide
from app.domain.divergence import Compatibility
from app.fleet.models import Server
from app.traffic.models import RequestRecord

DEFAULT_BLOCK_SIZE: Final = 16  # vLLM's default on GPUs, when no server says otherwise
SLOPE_WINDOW: Final = timedelta(hours=1)
SLOPE_MIN_SAMPLES: Final = 20


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


def request_record(key: RecordKey) -> RequestRecord | None:
    """The record with this key, its server and template joined, or None."""
    return (
        RequestRecord.objects.select_related("server", "template", "template_version")
        .filter(server_id=key.server_id, request_id=key.request_id, arrived_at=key.arrived_at)
        .first()
    )


def previous_request(record: RequestRecord) -> RequestRecord | None:
    """The request of the same template that arrived last before ``record`` (same server and model
    when the record has no template), its token ids loaded; None when there is none."""
    same = (
        Q(template_id=record.template_id)
        if record.template_id
        else Q(template__isnull=True, server_id=record.server_id, model=record.model)
    )
    return (
        RequestRecord.objects.select_related("server", "template", "template_version")
        .filter(same, arrived_at__lt=record.arrived_at)
        .order_by("-arrived_at")
        .first()
    )


@dataclass(frozen=True, slots=True)
class ExplorerRow:
    record: RequestRecord
    key: str
    has_tokens: bool


def recent_requests(
    *, template_id: int | None = None, server_id: int | None = None, limit: int = 50
) -> list[ExplorerRow]:
    """The latest request records, newest first, without their token ids or hashes (the explorer)."""
    records: QuerySet[RequestRecord] = (
        RequestRecord.objects.select_related("server", "template", "template_version")
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

    A request naming a model other than its server's base model asked for a LoRA adapter
    (vLLM serves adapters under their own model names). The tokenizer is the model's own.
    The KV-cache dtype is not recorded.
    """
    base = record.server.model or record.model
    adapter = record.model if record.model and record.server.model and record.model != base else None
    return Compatibility(
        model=base,
        tokenizer=base or None,
        lora_adapter=adapter,
        template=record.template.name if record.template else None,
        template_version=record.template_version.commit_sha if record.template_version else None,
        tenant_salt=record.salt_hash or None,
        kv_cache_dtype=None,
        hash_algo=record.server.hash_algo or None,
    )


def prefill_seconds_per_token(server: Server, *, now: datetime) -> tuple[float | None, int]:
    """The slope of TTFT over uncached prompt tokens on ``server`` in the last hour, and the
    number of requests behind it; None when fewer than SLOPE_MIN_SAMPLES requests had a TTFT."""
    figures = (
        RequestRecord.objects.filter(
            server=server,
            arrived_at__gte=now - SLOPE_WINDOW,
            arrived_at__lte=now,
            ttft_seconds__isnull=False,
            prompt_tokens__isnull=False,
        )
        .annotate(uncached=F("prompt_tokens") - Coalesce("cached_tokens", 0))
        .aggregate(slope=RegrSlope("ttft_seconds", "uncached"), samples=RegrCount("ttft_seconds", "uncached"))
    )
    samples = int(figures["samples"] or 0)
    return (figures["slope"] if samples >= SLOPE_MIN_SAMPLES else None), samples


# --- comparisons -------------------------------------------------------------------------------


def comparison(slug: str) -> Comparison:
    """The comparison with this slug, its sides prefetched. Raises Comparison.DoesNotExist."""
    return Comparison.objects.prefetch_related("sides__server").get(slug=slug)


def comparison_sides(comparison: Comparison) -> tuple[ComparisonSide, ComparisonSide]:
    """A comparison's side a and side b (from the prefetched sides)."""
    by_letter = {side.side: side for side in comparison.sides.all()}
    return by_letter["a"], by_letter["b"]


def recent_comparisons(*, limit: int = 10) -> QuerySet[Comparison]:
    return Comparison.objects.prefetch_related("sides__server")[:limit]


def tokens_kept(created_at: datetime, *, now: datetime) -> bool:
    """Whether a pasted prompt's token ids stored at ``created_at`` may still be read."""
    if settings.PREFIXSCOPE_HASH_ONLY:
        return False
    return created_at >= now - timedelta(days=settings.PREFIXSCOPE_TOKEN_RETENTION_DAYS)


def block_size_for(*servers: Server | None) -> int:
    """The first of the servers' block sizes (b's server first), else DEFAULT_BLOCK_SIZE."""
    return next((s.block_size for s in servers if s is not None and s.block_size), DEFAULT_BLOCK_SIZE)
