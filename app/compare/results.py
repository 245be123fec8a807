"""A comparison's sides resolved and compared: what the Compare page and the API show.

Results are never stored: the engine takes a few milliseconds, so a permalink recomputes them
from what its sides point at (recorded requests, or pasted prompts' token ids under retention).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
from django.conf import settings

from app.compare.display import Layout, edit_label, readable
from app.compare.models import Comparison, ComparisonSide
from app.compare.selectors import RecordKey, record_compatibility, request_record, tokens_kept
from app.compare.summary import CompatibilityRow, Estimate, PrefillSlope, compatibility_rows, estimate
from app.compare.tokenization import vocabulary_strs
from app.domain.blockhash import LoraKey, block_hash_chain, signed_to_wire
from app.domain.divergence import (
    Block,
    BlockMatch,
    Compatibility,
    Divergence,
    Side,
    compare_prompts,
    match_block_hashes,
    side_blocks,
)
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
        adapter, path = self.compatibility.lora_adapter, self.compatibility.lora_path
        unknown = self.compatibility.tenant_salt or (adapter and not path)  # vLLM hashes both
        if self.token_ids is None or self.record is not None or unknown:
            return [None] * full
        chain = block_hash_chain(
            self.token_ids[: full * block_size].tolist(),
            block_size,
            lora=LoraKey(adapter, path or "") if adapter else None,
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
    """One block of both sides: its token range, each side's wire hash and b's status ("" when b
    has no such block)."""

    index: int
    start: int
    end: int
    a_hash: int | None
    b_hash: int | None
    status: str

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Figures:
    """The summary of a comparison at either precision: token (a Divergence) or block (the stored
    hashes of hash-only records). ``first_divergence`` is the token, None at block precision or
    for identical token ids; the two labels read the same way at both precisions."""

    precision: Literal["token", "block"]
    reusable_tokens: int
    reusable_blocks: int
    b_length: int
    wasted_prefill_tokens: int
    blocked_by: tuple[str, ...]
    shared_blocks: int
    first_divergence: int | None
    first_divergent_block: int | None
    first_divergence_label: str  # "token 7", "block 5" or "none"
    first_divergence_detail: str  # where it lies, or why there is none


def token_figures(d: Divergence) -> Figures:
    """A Divergence's figures, to the token."""
    at = d.first_divergence
    block = None if at is None else at // d.block_size
    edits = len(d.edits)
    return Figures(
        precision="token",
        reusable_tokens=d.reusable_tokens,
        reusable_blocks=d.reusable_tokens // d.block_size,
        b_length=d.b_length,
        wasted_prefill_tokens=d.wasted_prefill_tokens,
        blocked_by=d.blocked_by,
        shared_blocks=d.shared_blocks,
        first_divergence=at,
        first_divergent_block=block,
        first_divergence_label="none" if at is None else f"token {at:,}",
        first_divergence_detail="identical token ids"
        if block is None
        else f"in block {block:,} · {edits:,} edit{_s(edits)}",
    )


def block_figures(m: BlockMatch) -> Figures:
    """A BlockMatch's figures, to the block."""
    block, matching = m.first_divergent_block, m.matching_blocks
    return Figures(
        precision="block",
        reusable_tokens=m.reusable_tokens,
        reusable_blocks=m.reusable_tokens // m.block_size,
        b_length=m.b_length,
        wasted_prefill_tokens=m.wasted_prefill_tokens,
        blocked_by=m.blocked_by,
        shared_blocks=0 if m.blocked_by else matching,
        first_divergence=None,
        first_divergent_block=block,
        first_divergence_label="none" if block is None else f"block {block:,}",
        first_divergence_detail=f"block precision: {matching:,} leading block{_s(matching)} match",
    )


def _s(count: int) -> str:
    return "" if count == 1 else "s"


@dataclass(frozen=True)
class Result:
    """A comparison computed: the divergence (token precision) or a block match (hash-only
    records), or ``problem`` when neither can be had. No reads: the page's layout is lazy."""

    slug: str
    block_size: int
    a: SideView
    b: SideView
    divergence: Divergence | None
    block_match: BlockMatch | None
    problem: str
    created_at: datetime
    # Whether its token text and ids may be shown: a recorded request's prompt is tenant data, shown
    # only to holders of prompts.read_prompt_text; where they part (positions, blocks, hashes) is not.
    tokens_shown: bool = True

    @cached_property
    def layout(self) -> Layout:
        assert self.tokens_shown, "the layout shows token text"
        assert self.divergence is not None and self.a.token_ids is not None and self.b.token_ids is not None
        return Layout(
            self.divergence,
            ids={"a": self.a.token_ids, "b": self.b.token_ids},
            texts={"a": self.a.texts, "b": self.b.texts},
        )

    @cached_property
    def figures(self) -> Figures | None:
        """The summary figures, to the token or to the block; None when nothing was compared."""
        if self.divergence is not None:
            return token_figures(self.divergence)
        return None if self.block_match is None else block_figures(self.block_match)

    @property
    def cost_server(self) -> Server | None:
        """The server whose TTFT slope prices the wasted prefill: b's, else a's."""
        return self.b.server or self.a.server

    def estimate(self, slope: PrefillSlope) -> Estimate | None:
        """The cost of the wasted prefill tokens at ``slope`` (see selectors.prefill_slope)."""
        if self.figures is None:
            return None
        return estimate(
            self.figures.wasted_prefill_tokens,
            slope,
            assumed_tokens_per_second=settings.PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND,
            gpu_hour_price=settings.PREFIXSCOPE_GPU_HOUR_PRICE,
        )

    @property
    def sides(self) -> tuple[SideView, SideView]:
        return (self.a, self.b)

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

    def blocks(self, side: Side) -> tuple[Block, ...]:
        """Every block of one side with its wire hash (SideView.wire_hashes) and status; () at
        block precision."""
        view, d = (self.a if side == "a" else self.b), self.divergence
        if d is None or view.length is None:
            return ()
        return side_blocks(d, side, view.wire_hashes(view.length // self.block_size, self.block_size))

    @property
    def edit_labels(self) -> list[str]:
        """Each edit in token positions alone (no text): "replaced a 7 (1 token) by b 7 (1 token)"."""
        d = self.divergence
        return [edit_label(e.kind, e.a_start, e.a_end, e.b_start, e.b_end) for e in d.edits] if d else []

    @cached_property
    def block_rows(self) -> list[BlockRow]:
        """Every block of either side, a's and b's hash side by side with b's status: where the prompts
        part, block by block, for a viewer not shown their tokens."""
        a_blocks, b_blocks = self.blocks("a"), self.blocks("b")
        size, rows = self.block_size, []
        for index in range(max(len(a_blocks), len(b_blocks))):
            a = a_blocks[index] if index < len(a_blocks) else None
            b = b_blocks[index] if index < len(b_blocks) else None
            end = max(block.end for block in (a, b) if block is not None)
            rows.append(BlockRow(index=index, start=index * size, end=end,
                                 a_hash=a.wire_hash if a else None, b_hash=b.wire_hash if b else None,
                                 status=str(b.status) if b else ""))  # fmt: skip
        return rows

    @cached_property
    def divergence_blocks(self) -> list[BlockRow]:
        """The last shared block and the block where the prompts part (or, for identical prompts
        under different records, the first block), with both sides' hashes as evidence."""
        d = self.divergence
        if d is None or (d.identical and not d.blocked_by):
            return []
        size = self.block_size
        at = 0 if d.first_divergence is None else d.first_divergence // size
        a_blocks = side_blocks(d, "a", self.a.wire_hashes(at + 1, size))
        b_blocks = side_blocks(d, "b", self.b.wire_hashes(at + 1, size))
        rows = []
        for index in range(max(at - 1, 0), at + 1):
            a_block = a_blocks[index] if index < len(a_blocks) else None
            b_block = b_blocks[index] if index < len(b_blocks) else None
            rows.append(
                BlockRow(
                    index=index,
                    start=index * size,
                    end=(index + 1) * size,
                    a_hash=a_block.wire_hash if a_block else None,
                    b_hash=b_block.wire_hash if b_block else None,
                    status=str(b_block.status) if b_block else "",
                )
            )
        return rows


def comparison_result(
    comparison: Comparison,
    sides: tuple[ComparisonSide, ComparisonSide],
    *,
    now: datetime,
    reads_prompts: bool = True,
) -> Result:
    """Resolve both sides and compare them, as vLLM's prefix cache would (b later than a).
    ``reads_prompts``: whether the viewer holds prompts.read_prompt_text; without it a comparison
    with a recorded request is computed all the same but its tokens are not shown (``tokens_shown``)."""
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
        tokens_shown=reads_prompts or all(s.source != ComparisonSide.Source.RECORD for s in (a, b)),
    )
