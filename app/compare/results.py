"""A comparison's sides resolved and compared: what the Compare page and the API show.

Results are never stored: the engine takes a few milliseconds, so a permalink recomputes them
from what its sides point at (recorded requests, or pasted prompts' token ids under retention).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Final

import numpy as np
import numpy.typing as npt

from app.compare.display import Layout, readable
from app.compare.models import Comparison, ComparisonSide
from app.compare.selectors import (
    RecordKey,
    prefill_seconds_per_token,
    record_compatibility,
    request_record,
    tokens_kept,
)
from app.compare.summary import (
    BlockMatch,
    CompatibilityRow,
    Estimate,
    compatibility_rows,
    estimate,
    match_block_hashes,
)
from app.compare.tokenization import vocabulary_strs
from app.domain.blockhash import block_hash_chain, signed_to_wire
from app.domain.divergence import Block, BlockStatus, Compatibility, Divergence, compare_prompts
from app.fleet.models import Server
from app.traffic.models import RequestRecord

RECORD_TEXT_SOURCE: Final = (
    "bundled GPT-2 vocabulary (the ids are the server's; the text is exact for GPT-2 models)"
)


@dataclass(frozen=True, slots=True)
class SideView:
    """One side resolved: its tokens (None when no longer kept), hashes, records and labels."""

    side: str
    source: str
    label: str
    token_ids: npt.NDArray[np.int64] | None
    token_strs: list[str] | None
    block_hashes: list[int] | None  # as stored with a recorded request: int64, see signed_to_wire
    length: int | None
    compatibility: Compatibility
    tokenizer_used: str
    warning: str
    text_source: str
    missing: str  # why the token ids are not available; "" when they are
    record: RequestRecord | None
    server: Server | None

    def texts(self, start: int, end: int) -> list[str]:
        """The readable texts of tokens ``[start, end)``."""
        if self.token_strs is not None:
            return [readable(s) for s in self.token_strs[start:end]]
        assert self.token_ids is not None
        return [readable(s) for s in vocabulary_strs(self.token_ids[start:end].tolist())]

    def wire_hashes(self, count: int, block_size: int) -> list[int | None]:
        """The wire hashes of the first ``count`` full blocks (fewer when the prompt is shorter).

        Stored with a recorded request (when its server's block size is ``block_size``);
        computed for an unsalted prompt; None for a salted prompt, whose salt is kept hashed.
        """
        full = min(count, (self.length or 0) // block_size)
        hashes = self.block_hashes
        if hashes is not None and self.server is not None and self.server.block_size == block_size:
            return [signed_to_wire(hashes[i]) if i < len(hashes) else None for i in range(full)]
        if self.token_ids is None or self.record is not None or self.compatibility.tenant_salt:
            return [None] * full
        chain = block_hash_chain(
            self.token_ids[: full * block_size].tolist(),
            block_size,
            lora_name=self.compatibility.lora_adapter,
        )
        return [block.wire for block in chain]


def side_view(row: ComparisonSide, *, created_at: datetime, now: datetime) -> SideView:
    """Resolve a comparison side (saved or not) into what the page and the API show."""
    compatibility = Compatibility(**row.compatibility)
    if row.source != ComparisonSide.Source.RECORD:
        kept = row.token_ids is not None and (row.pk is None or tokens_kept(created_at, now=now))
        return SideView(
            side=row.side, source=row.source, label=row.summary,
            token_ids=np.asarray(row.token_ids, dtype=np.int64) if kept else None,
            token_strs=list(row.token_strs) if kept and row.token_strs is not None else None,
            block_hashes=None, length=len(row.token_ids) if kept and row.token_ids is not None else None,
            compatibility=compatibility, tokenizer_used=row.tokenizer_used, warning=row.tokenizer_warning,
            text_source="the server's token strings" if row.token_strs else "bundled GPT-2 vocabulary",
            missing="" if kept else "the pasted prompt's token ids are past their retention",
            record=None, server=row.server,
        )  # fmt: skip
    record = None
    if row.server_id is not None and row.arrived_at is not None:
        record = request_record(RecordKey(row.server_id, row.request_id, row.arrived_at))
    return record_view(row.side, record, compatibility=compatibility, request_id=row.request_id)


def record_view(
    side: str,
    record: RequestRecord | None,
    *,
    compatibility: Compatibility | None = None,
    request_id: str = "",
) -> SideView:
    """A recorded request as a side; ``compatibility`` as saved, else the record's own."""
    if record is None:
        return SideView(
            side=side, source="record", label=f"request {request_id}", token_ids=None, token_strs=None,
            block_hashes=None, length=None, compatibility=compatibility or Compatibility(model=""),
            tokenizer_used="recorded token ids", warning="", text_source="",
            missing="the request is no longer kept (past the request retention)", record=None, server=None,
        )  # fmt: skip
    ids = None if record.token_ids is None else np.asarray(record.token_ids, dtype=np.int64)
    label = f"request {record.request_id} on {record.server.name}, {record.arrived_at:%Y-%m-%d %H:%M:%S} UTC"
    if record.template:
        label += f", template {record.template.name}"
    return SideView(
        side=side, source="record", label=label, token_ids=ids, token_strs=None,
        block_hashes=list(record.block_hashes) if record.block_hashes else None,
        length=len(ids) if ids is not None else record.prompt_tokens,
        compatibility=compatibility or record_compatibility(record),
        tokenizer_used=f"recorded token ids (server {record.server.name})", warning="",
        text_source=RECORD_TEXT_SOURCE,
        missing="" if ids is not None else "its token ids are no longer kept (retention or hash-only mode)",
        record=record, server=record.server,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class BlockRow:
    """One block of both sides: its token range, each side's wire hash and its status for b."""

    index: int
    start: int
    end: int
    a_hash: int | None
    b_hash: int | None
    status: str


@dataclass(frozen=True)
class Result:
    """A comparison computed: the divergence (token precision) or a block match (hash-only
    records), or ``problem`` when neither can be had. Figures that need more reads are lazy."""

    slug: str
    block_size: int
    a: SideView
    b: SideView
    divergence: Divergence | None
    block_match: BlockMatch | None
    problem: str
    created_at: datetime
    now: datetime

    @cached_property
    def layout(self) -> Layout:
        assert self.divergence is not None and self.a.token_ids is not None and self.b.token_ids is not None
        return Layout(
            self.divergence,
            ids={"a": self.a.token_ids, "b": self.b.token_ids},
            texts={"a": self.a.texts, "b": self.b.texts},
        )

    @cached_property
    def estimate(self) -> Estimate | None:
        """The cost of the wasted prefill tokens at b's server's measured TTFT slope, or assumed."""
        figures = self.divergence or self.block_match
        if figures is None:
            return None
        server = self.b.server or self.a.server
        if server is None:
            return estimate(figures.wasted_prefill_tokens, None, "", 0)
        slope, samples = prefill_seconds_per_token(server, now=self.now)
        return estimate(figures.wasted_prefill_tokens, slope, server.name, samples)

    @property
    def sides(self) -> tuple[SideView, SideView]:
        return (self.a, self.b)

    @property
    def first_divergence_block(self) -> int | None:
        """The block holding the first differing token (to the block when only hashes are kept)."""
        if self.block_match is not None:
            return self.block_match.first_divergent_block
        d = self.divergence
        return None if d is None or d.first_divergence is None else d.first_divergence // self.block_size

    @property
    def shared_blocks(self) -> int | None:
        if self.block_match is not None:
            return 0 if self.block_match.blocked_by else self.block_match.matching_blocks
        return None if self.divergence is None else self.divergence.shared_blocks

    @property
    def reusable_blocks(self) -> int:
        figures = self.divergence or self.block_match
        return 0 if figures is None else figures.reusable_tokens // self.block_size

    @property
    def compatibility_rows(self) -> list[CompatibilityRow]:
        return compatibility_rows(self.a.compatibility, self.b.compatibility)

    @property
    def block_size_note(self) -> str:
        sizes = {s.server.block_size for s in self.sides if s.server is not None and s.server.block_size}
        if len(sizes) > 1:
            listed = ", ".join(map(str, sorted(sizes)))
            return f"the servers use different block sizes ({listed}): compared with b's"
        return ""

    @cached_property
    def divergence_blocks(self) -> list[BlockRow]:
        """The last shared block and the block where the prompts part (or, for identical prompts
        under different records, the first block), with both sides' hashes as evidence."""
        d = self.divergence
        if d is None or (d.identical and not d.blocked_by):
            return []
        size = self.block_size
        at = 0 if d.first_divergence is None else d.first_divergence // size
        a_hashes, b_hashes = self.a.wire_hashes(at + 1, size), self.b.wire_hashes(at + 1, size)
        return [
            BlockRow(
                index=index,
                start=index * size,
                end=(index + 1) * size,
                a_hash=a_hashes[index] if index < len(a_hashes) else None,
                b_hash=b_hashes[index] if index < len(b_hashes) else None,
                status=_status(index, (index + 1) * size <= d.b_length, d.shared_blocks),
            )
            for index in range(max(at - 1, 0), at + 1)
        ]

    def blocks(self, side: str) -> list[Block]:
        """Every block of one side with its hash (see SideView.wire_hashes) and status; for the API."""
        view, d, size = (self.a if side == "a" else self.b), self.divergence, self.block_size
        if d is None or view.length is None:
            return []
        hashes = view.wire_hashes(view.length // size, size)
        return [
            Block(
                index=index,
                start=start,
                end=min(start + size, view.length),
                wire_hash=hashes[index] if index < len(hashes) else None,
                status=BlockStatus(_status(index, start + size <= view.length, d.shared_blocks)),
            )
            for index, start in enumerate(range(0, view.length, size))
        ]


def _status(index: int, full: bool, shared_blocks: int) -> str:
    if not full:
        return str(BlockStatus.PARTIAL_TAIL)
    return str(BlockStatus.SHARED if index < shared_blocks else BlockStatus.DIVERGED)


def comparison_result(
    comparison: Comparison, sides: tuple[ComparisonSide, ComparisonSide], *, now: datetime
) -> Result:
    """Resolve both sides and compare them, as vLLM's prefix cache would (b later than a)."""
    a, b = (side_view(row, created_at=comparison.created_at, now=now) for row in sides)
    size = comparison.block_size
    divergence = block_match = None
    problem = ""
    if a.token_ids is not None and b.token_ids is not None:
        divergence = compare_prompts(a.token_ids, b.token_ids, size, a.compatibility, b.compatibility)
    elif all(s.block_hashes is not None and s.server and s.server.block_size == size for s in (a, b)):
        block_match = match_block_hashes(
            a.block_hashes or [], b.block_hashes or [], a_length=a.length or 0, b_length=b.length or 0,
            block_size=size, a_compatibility=a.compatibility, b_compatibility=b.compatibility,
        )  # fmt: skip
    else:
        missing = "; ".join(f"side {s.side}: {s.missing}" for s in (a, b) if s.missing)
        problem = missing or "the recorded block hashes were made with another block size"
    return Result(
        slug=comparison.slug if comparison.pk is not None else "",
        block_size=size,
        a=a,
        b=b,
        divergence=divergence,
        block_match=block_match,
        problem=problem,
        created_at=comparison.created_at,
        now=now,
    )
