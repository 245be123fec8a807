"""The figures beside the token stream: the cost estimate, the compatibility records side by side,
and the block-precise match of two recorded prompts whose token ids are no longer kept. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Final

from app.domain.blocks import reusable_tokens
from app.domain.divergence import REUSE_FIELDS, Compatibility, compare_prompts

DEFAULT_PREFILL_TOKENS_PER_SECOND: Final = 10_000.0
"""Assumed when a server's own TTFT slope cannot be measured: a mid-size model on one GPU."""
GPU_HOUR_USD: Final = 2.50
"""Assumed price of one GPU-hour, to turn prefill seconds into money."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """What the wasted prefill tokens cost, under a stated assumption (``basis``)."""

    wasted_tokens: int
    seconds_per_token: float
    basis: str
    measured: bool

    @property
    def ttft_seconds(self) -> float:
        """Extra time to first token of one request like b."""
        return self.wasted_tokens * self.seconds_per_token

    @property
    def gpu_seconds_per_1000(self) -> float:
        """GPU time spent recomputing the wasted tokens of 1,000 requests like b."""
        return 1000 * self.ttft_seconds

    @property
    def usd_per_1000(self) -> float:
        return self.gpu_seconds_per_1000 / 3600 * GPU_HOUR_USD


def estimate(wasted_tokens: int, seconds_per_token: float | None, server_name: str, samples: int) -> Estimate:
    """The cost of ``wasted_tokens``: at the measured TTFT slope when there is one, else assumed."""
    if seconds_per_token is not None and seconds_per_token > 0:
        basis = (
            f"measured on {server_name}: the slope of TTFT over uncached prompt tokens of "
            f"{samples:,} requests in the last hour, {1 / seconds_per_token:,.0f} prefill tokens/s"
        )
        return Estimate(wasted_tokens, seconds_per_token, basis, True)
    basis = f"assumed {DEFAULT_PREFILL_TOKENS_PER_SECOND:,.0f} prefill tokens/s (no measured TTFT slope)"
    return Estimate(wasted_tokens, 1 / DEFAULT_PREFILL_TOKENS_PER_SECOND, basis, False)


@dataclass(frozen=True, slots=True)
class CompatibilityRow:
    """One field of the two compatibility records; ``blocks``: a difference stops all reuse."""

    field: str
    a: str
    b: str
    differs: bool
    blocks: bool

    @property
    def effect(self) -> str:
        if not self.differs:
            return ""
        return "blocks all reuse" if self.blocks else "noted: reuse follows the token ids"


def compatibility_rows(a: Compatibility, b: Compatibility) -> list[CompatibilityRow]:
    """Every compatibility field side by side, in the record's order."""
    rows = []
    for field in (f.name for f in fields(Compatibility)):
        a_value, b_value = getattr(a, field), getattr(b, field)
        if field == "tenant_salt":
            a_value, b_value = a_value or None, b_value or None  # an empty salt is no salt
        differs = a_value != b_value
        rows.append(
            CompatibilityRow(
                field=field,
                a=_shown(field, a_value),
                b=_shown(field, b_value),
                differs=differs,
                blocks=differs and field in REUSE_FIELDS,
            )
        )
    return rows


def _shown(field: str, value: str | None) -> str:
    if value is None:
        return "none" if field in ("lora_adapter", "tenant_salt") else "—"
    if field == "tenant_salt":
        return f"sha256 {value[:12]}…" if len(value) == 64 else "(set)"
    if field == "template_version":
        return value[:12]
    return value


@dataclass(frozen=True, slots=True)
class BlockMatch:
    """Two recorded prompts compared by their stored block hashes alone: exact to the block.

    ``matching_blocks``: leading blocks with equal hashes (the salt is inside the hashes).
    The first differing token lies in block ``matching_blocks`` (unless all blocks match).
    """

    block_size: int
    a_length: int
    b_length: int
    a_blocks: int
    b_blocks: int
    matching_blocks: int
    reusable_tokens: int
    wasted_prefill_tokens: int
    blocked_by: tuple[str, ...]

    @property
    def first_divergent_block(self) -> int | None:
        if self.matching_blocks == self.a_blocks == self.b_blocks:
            return None
        return self.matching_blocks


def match_block_hashes(
    a_hashes: Sequence[int],
    b_hashes: Sequence[int],
    *,
    a_length: int,
    b_length: int,
    block_size: int,
    a_compatibility: Compatibility,
    b_compatibility: Compatibility,
) -> BlockMatch:
    """Compare two prompts by their block hash chains (hash-only retention)."""
    # The engine's verdict on the two records alone: two empty prompts under them.
    blocked = compare_prompts((), (), block_size, a_compatibility, b_compatibility).blocked_by
    matching = 0
    for a_hash, b_hash in zip(a_hashes, b_hashes, strict=False):
        if a_hash != b_hash:
            break
        matching += 1
    reusable = 0 if blocked else reusable_tokens(matching * block_size, b_length, block_size)
    ideal = reusable_tokens(min(a_length, b_length), b_length, block_size)
    return BlockMatch(
        block_size=block_size,
        a_length=a_length,
        b_length=b_length,
        a_blocks=len(a_hashes),
        b_blocks=len(b_hashes),
        matching_blocks=matching,
        reusable_tokens=reusable,
        wasted_prefill_tokens=max(ideal - reusable, 0),
        blocked_by=blocked,
    )
