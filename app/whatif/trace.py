"""A window of stored request records as the replay's trace, and the fleet they were served by.

Every record of the window's servers becomes a TraceRequest: the block hashes the collector stored
(the engine's chain at the server's block size, salted as the engine hashed it; the unsalted chain
beside it), the token ids where retention still keeps them, the reported cached tokens, and a hold
time (its TTFT and its output at PREFIXSCOPE_DECODE_SECONDS_PER_TOKEN). Records without a prompt
token count cannot be replayed and are counted apart. Token ids stay in this process: nothing here
logs or returns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Min

from app.diagnosis.counters import unwired_counters
from app.domain.replay.run import Restart, ServerShape
from app.domain.replay.trace import TraceRequest
from app.fleet.models import Server
from app.traffic.kv_blocks import kv_blocks
from app.traffic.models import KVEvent, RequestRecord

WARM_UP = timedelta(minutes=10)
"""Traffic replayed before a window, uncounted, so that its first requests meet warm caches."""
FIELDS = (
    "request_id", "arrived_at", "server_id", "model", "tenant", "template__name", "salt_hash",
    "prompt_tokens", "cached_tokens", "completion_tokens", "client_ttft_seconds", "server_ttft_seconds",
    "block_hashes", "neutral_hashes", "token_ids",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class WindowTrace:
    """The window's requests in arrival order, the servers that served them as the replay shapes
    them, their block size, and what could not be replayed."""

    requests: list[TraceRequest]
    servers: tuple[ServerShape, ...]
    block_size: int
    restarts: tuple[Restart, ...]
    counted_from: float  # requests before it warm the caches up and are not answered for
    unknown_prompt: int  # records without a prompt token count, left out
    unsized: tuple[str, ...]  # servers without a known block size or KV blocks, left out with their records
    unwired: tuple[str, ...]  # servers whose hit counter was not wired: what they reported is no measure


def window_trace(*, servers: Sequence[Server], since: datetime, until: datetime) -> WindowTrace:
    """The records of `servers` that arrived in [since, until), as a trace, after those of the
    WARM_UP before it (a replay starts with empty caches; the engines' were not). A server is
    replayed at the KV blocks of its cache_config_info pulls (else its registered ones), started
    anew where its KV events begin a new epoch; the fleet at its most common block size. Servers of
    another block size or of unknown size are left out, with their records, and named."""
    start = since - WARM_UP
    shapes, sizes, unsized = _shapes(servers, since=start, until=until)
    block_size = max(set(sizes.values()), key=list(sizes.values()).count) if sizes else 16
    kept = {pk: shape for pk, shape in shapes.items() if sizes[pk] == block_size}
    unsized += tuple(shapes[pk].name for pk in shapes if pk not in kept)
    rows = (
        RequestRecord.objects.filter(server_id__in=list(kept), arrived_at__gte=start, arrived_at__lt=until)
        .order_by("arrived_at", "server_id", "request_id")
        .values_list(*FIELDS)
    )  # fmt: skip
    requests, unknown = [], 0
    for row in rows.iterator(chunk_size=2000):
        request = _request(dict(zip(FIELDS, row, strict=True)), kept, block_size)
        if request is None:
            unknown += 1
        else:
            requests.append(request)
    restarts = tuple(
        restart for server in servers if server.pk in kept
        for restart in _restarts(server, kept[server.pk], since=start, until=until)
    )  # fmt: skip
    unwired = unwired_counters(since=start, until=until, only=list(kept))
    return WindowTrace(
        requests, tuple(kept.values()), block_size, restarts, since.timestamp(), unknown, unsized,
        tuple(sorted(kept[pk].name for pk in unwired if pk in kept)),
    )  # fmt: skip


def _restarts(server: Server, shape: ServerShape, *, since: datetime, until: datetime) -> list[Restart]:
    """Where the server's KV events begin a new epoch in [since, until) (a new process: its cache
    empty), each with the blocks its pulls then said (else the shape's)."""
    epochs = (
        KVEvent.objects.filter(server=server, emitted_at__gte=since, emitted_at__lt=until)
        .values("epoch").annotate(first=Min("emitted_at")).order_by("first")
    )  # fmt: skip
    starts = [row["first"] for row in epochs][1:]  # the first is the one the window began in
    ends = [*starts[1:], until][: len(starts)]
    return [
        Restart(at.timestamp(), shape.name, kv_blocks(server, since=at, until=end) or shape.num_blocks)
        for at, end in zip(starts, ends, strict=True)
    ]


def _shapes(
    servers: Sequence[Server], *, since: datetime, until: datetime
) -> tuple[dict[int, ServerShape], dict[int, int], tuple[str, ...]]:
    shapes, sizes, unsized = {}, {}, []
    for server in servers:
        # The blocks it had as the window began: its first pull's, else its last one's, else as registered.
        blocks = kv_blocks(server, since=since, until=since + WARM_UP + timedelta(minutes=1), first=True)
        blocks = blocks or kv_blocks(server, since=since, until=until) or server.num_gpu_blocks
        if not server.block_size or not blocks or blocks < 2:
            unsized.append(server.name)
            continue
        hit = server.hit_block  # known: its block size is
        effective = hit.effective if hit is not None and hit.effective > hit.block_size else 0
        shapes[server.pk] = ServerShape(server.name, blocks, effective, hit is not None and hit.drops_last)
        sizes[server.pk] = server.block_size
    return shapes, sizes, tuple(unsized)


def _request(row: dict[str, object], servers: dict[int, ServerShape], block_size: int) -> TraceRequest | None:
    prompt = row["prompt_tokens"]
    if not isinstance(prompt, int) or prompt < 1:
        return None
    output = row["completion_tokens"] if isinstance(row["completion_tokens"], int) else 0
    ttft = row["server_ttft_seconds"] or row["client_ttft_seconds"] or 0.0
    tokens = row["token_ids"]
    arrived: datetime = row["arrived_at"]  # type: ignore[assignment]
    return TraceRequest(
        request_id=str(row["request_id"]),
        arrived=arrived.timestamp(),
        prompt_tokens=prompt,
        server=servers[row["server_id"]].name,  # type: ignore[index]
        group=str(row["model"]),
        salt=str(row["salt_hash"]),
        tenant=str(row["tenant"]),
        template=str(row["template__name"] or ""),
        output_tokens=output,
        held_seconds=float(ttft) + output * settings.PREFIXSCOPE_DECODE_SECONDS_PER_TOKEN,  # type: ignore[arg-type]
        block_size=block_size,
        block_hashes=tuple(row["block_hashes"] or ()),  # type: ignore[arg-type]
        unsalted_hashes=tuple(row["neutral_hashes"] or ()),  # type: ignore[arg-type]
        token_ids=None if tokens is None else tuple(tokens),  # type: ignore[arg-type]
        cached_tokens=row["cached_tokens"] if isinstance(row["cached_tokens"], int) else None,
    )
