"""Where two prompts stop sharing vLLM's prefix cache, and what that costs.

Given the prompt a server cached first (``a``) and a later prompt (``b``), a Divergence
says, exactly as vLLM decides it: the first differing token, the common prefix, the
tokens ``b`` reuses (whole blocks only, never its last token, nothing when the two
compatibility records differ in a field that changes the cached activations), the
prefill tokens wasted relative to a perfect match, and the edit between the two
(``app.domain.divergence_edits``). The block hash chain of each side is computed apart,
on demand, by ``block_statuses``: hashing 128K tokens costs 20 to 70 ms (blocks of 128
down to 16 tokens), while ``compare_prompts`` takes a few milliseconds
(bench/bench_divergence.py). Prompts kept as block hashes only (hash-only retention) compare
to the block: ``match_block_hashes``.

Only the prompts count: the tokens a server generated after ``a`` (which vLLM caches
too) are not known here. Multimodal inputs and prompt embeddings are not modelled.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from app.domain.blockhash import LoraKey, block_hash_chain
from app.domain.blocks import full_blocks, reusable_tokens
from app.domain.divergence_edits import (
    MAX_EDIT_DISTANCE,
    Edit,
    EditKind,
    TokenArray,
    common_prefix_length,
    edit_script,
)

__all__ = [
    "MAX_EDIT_DISTANCE",
    "NOTED_FIELDS",
    "REUSE_FIELDS",
    "Block",
    "BlockMatch",
    "BlockStatus",
    "Compatibility",
    "Divergence",
    "Edit",
    "EditKind",
    "Side",
    "TokenIds",
    "block_statuses",
    "blocked_by",
    "compare_prompts",
    "match_block_hashes",
    "shared_leading_blocks",
    "side_blocks",
]

TokenIds: TypeAlias = Sequence[int] | npt.NDArray[np.integer[Any]]
"""A prompt's token ids: a list (or other sequence) of ints, or a 1-D integer array."""

Side: TypeAlias = Literal["a", "b"]
"""Which prompt of a comparison: ``a``, cached first, or ``b``, the later one."""

REUSE_FIELDS: Final = ("model", "lora_adapter", "lora_path", "tenant_salt", "kv_cache_dtype", "hash_algo")
"""Compatibility fields that change the cached activations or their hashes: any difference
means nothing is reused."""

NOTED_FIELDS: Final = ("tokenizer", "template", "template_version")
"""Compatibility fields whose difference is worth a note but does not stop reuse by itself:
vLLM matches token ids, whatever produced them."""

HASHED_ALGO: Final = "sha256_cbor"
"""The only ``--prefix-caching-hash-algo`` whose block hashes reproduce outside vLLM."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Compatibility:
    """What, besides the token ids, decides whether one prompt's cached blocks serve another.

    ``None`` is a value like any other: no adapter (the base model), no salt, or a field
    not recorded, and two records agree on a field only when both hold the same value.
    ``tenant_salt`` is the request's ``cache_salt`` or a hash of it (equality is all
    reuse needs); block wire hashes match the server's only with the salt itself. An
    empty salt counts as no salt, as in vLLM.
    """

    model: str
    tokenizer: str | None = None
    lora_adapter: str | None = None
    lora_path: str | None = None  # where the server loaded the adapter from: vLLM hashes it too
    template: str | None = None
    template_version: str | None = None
    tenant_salt: str | None = None
    kv_cache_dtype: str | None = None
    hash_algo: str | None = None


class BlockStatus(StrEnum):
    """A block of one side, seen from the other side's cached chain."""

    SHARED = "shared"
    DIVERGED = "diverged"
    PARTIAL_TAIL = "partial_tail"


@dataclass(frozen=True, slots=True)
class Block:
    """One block of a prompt: tokens ``[start, end)`` and how it stands against the other side.

    ``wire_hash`` is the uint64 vLLM publishes in its KV events; None for a partial tail
    (vLLM never hashes it) and when the side's hash algorithm is not ``sha256_cbor`` (an
    unrecorded algorithm is taken to be ``sha256_cbor``, the only one that reproduces).
    """

    index: int
    start: int
    end: int
    wire_hash: int | None
    status: BlockStatus


@dataclass(frozen=True, slots=True)
class Divergence:
    """How a later prompt ``b`` fares against a cached prompt ``a``.

    ``common_prefix``: leading tokens equal on both sides. ``reusable_tokens``: what vLLM
    would report as ``cached_tokens`` for ``b`` with all of ``a``'s blocks resident; 0
    when ``blocked_by`` names fields (of REUSE_FIELDS) that differ. ``wasted_prefill_tokens``:
    the reusable tokens ``b`` would have had, had it matched ``a`` over their common length
    (up to ``b``'s own length minus its last token), minus ``reusable_tokens``.
    ``notes``: readable remarks (tokenizer or template differences, an inexact edit).
    ``edits``: the spans that differ, exact unless ``edits_exact`` is False.
    """

    a_length: int
    b_length: int
    block_size: int
    common_prefix: int
    reusable_tokens: int
    wasted_prefill_tokens: int
    blocked_by: tuple[str, ...]
    notes: tuple[str, ...]
    edits: tuple[Edit, ...]
    edits_exact: bool
    a_compatibility: Compatibility
    b_compatibility: Compatibility

    @property
    def identical(self) -> bool:
        """Whether the two token sequences are equal (the records may still differ)."""
        return self.a_length == self.b_length == self.common_prefix

    @property
    def first_divergence(self) -> int | None:
        """The first token index where the sequences differ; None when they are equal.

        When one sequence is a prefix of the other, it is the index where the shorter one
        ends (its length): the first token that only the longer one has.
        """
        return None if self.identical else self.common_prefix

    @property
    def shared_blocks(self) -> int:
        """Full blocks with the same hash and the same cached activations on both sides."""
        return 0 if self.blocked_by else full_blocks(self.common_prefix, self.block_size)


def compare_prompts(
    a: TokenIds,
    b: TokenIds,
    block_size: int,
    a_compatibility: Compatibility,
    b_compatibility: Compatibility,
    *,
    max_edit_distance: int = MAX_EDIT_DISTANCE,
) -> Divergence:
    """Compare a later prompt ``b`` with a cached prompt ``a``, as vLLM's prefix cache would.

    Pure and vectorised: a few milliseconds for two 128K-token prompts, most of it turning
    lists into arrays (pass numpy arrays to skip that). Block hashes are not computed here:
    see ``block_statuses``. Empty prompts are allowed (nothing is reusable from or for an
    empty prompt). ``max_edit_distance`` bounds the edit search (``edit_script``).
    Raises ValueError when block_size <= 0, TypeError when token ids are not integers.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    a_tokens, b_tokens = _as_array(a), _as_array(b)
    prefix = common_prefix_length(a_tokens, b_tokens)
    blocked = blocked_by(a_compatibility, b_compatibility)
    reusable = 0 if blocked else reusable_tokens(prefix, len(b_tokens), block_size)
    ideal = reusable_tokens(min(len(a_tokens), len(b_tokens)), len(b_tokens), block_size)
    script = edit_script(a_tokens, b_tokens, max_distance=max_edit_distance)
    notes = _notes(a_compatibility, b_compatibility, script.exact, max_edit_distance)
    return Divergence(
        a_length=len(a_tokens),
        b_length=len(b_tokens),
        block_size=block_size,
        common_prefix=prefix,
        reusable_tokens=reusable,
        wasted_prefill_tokens=ideal - reusable,
        blocked_by=blocked,
        notes=notes,
        edits=script.edits,
        edits_exact=script.exact,
        a_compatibility=a_compatibility,
        b_compatibility=b_compatibility,
    )


def block_statuses(divergence: Divergence, side: Side, token_ids: TokenIds) -> tuple[Block, ...]:
    """Return the blocks of one side of a comparison, with their wire hashes and statuses.

    ``token_ids`` are that side's tokens, as given to ``compare_prompts``. Hashes use the
    side's ``tenant_salt`` and ``lora_adapter``; 20 to 70 ms for 128K tokens, which is why
    ``compare_prompts`` leaves it out. Statuses as ``side_blocks`` gives them.
    Raises ValueError when ``token_ids`` do not have that side's length.
    """
    compatibility = divergence.a_compatibility if side == "a" else divergence.b_compatibility
    length = divergence.a_length if side == "a" else divergence.b_length
    tokens = _as_array(token_ids)
    if len(tokens) != length:
        raise ValueError(f"side {side} has {length} tokens, got {len(tokens)}")
    return side_blocks(divergence, side, _wire_hashes(tokens, divergence.block_size, compatibility))


def side_blocks(divergence: Divergence, side: Side, wire_hashes: Sequence[int | None]) -> tuple[Block, ...]:
    """Return every block of one side with the given wire hashes and its status.

    ``wire_hashes``: one per full block, from the first; blocks beyond the list get None
    (a recorded request's stored chain, or hashes that cannot be reproduced). A block is
    SHARED when it lies within the common prefix and the records allow reuse (vLLM still
    recomputes ``b``'s last token, so ``b``'s last shared block may not all count as
    reusable), DIVERGED otherwise; a trailing block shorter than the block size is a
    PARTIAL_TAIL, never hashed.
    """
    length = divergence.a_length if side == "a" else divergence.b_length
    size = divergence.block_size
    return tuple(
        Block(
            index=index,
            start=start,
            end=min(start + size, length),
            wire_hash=wire_hashes[index] if start + size <= length and index < len(wire_hashes) else None,
            status=_status(index, start + size <= length, divergence.shared_blocks),
        )
        for index, start in enumerate(range(0, length, size))
    )


def _status(index: int, full: bool, shared_blocks: int) -> BlockStatus:
    if not full:
        return BlockStatus.PARTIAL_TAIL
    return BlockStatus.SHARED if index < shared_blocks else BlockStatus.DIVERGED


def _wire_hashes(tokens: TokenArray, block_size: int, compatibility: Compatibility) -> list[int | None]:
    """The wire hash of every full block, or Nones when it cannot be reproduced: another hash
    algorithm, or a LoRA adapter whose path is not known (vLLM hashes the adapter's name and path)."""
    adapter = compatibility.lora_adapter
    if compatibility.hash_algo not in (None, HASHED_ALGO) or (adapter and not compatibility.lora_path):
        return [None] * (len(tokens) // block_size)
    chain = block_hash_chain(
        tokens.tolist(),
        block_size,
        cache_salt=compatibility.tenant_salt or None,
        lora=LoraKey(adapter, compatibility.lora_path or "") if adapter else None,
    )
    return [block.wire for block in chain]


def _as_array(token_ids: TokenIds) -> TokenArray:
    """Return the token ids as a 1-D integer array, without copying an array.

    A sequence goes through ``array.array("q")``, which is as fast as numpy's own
    conversion and, unlike it, refuses floats and strings instead of rounding them.
    Raises TypeError for token ids that are not integers, OverflowError for ids beyond
    int64, ValueError for an array that is not one-dimensional.
    """
    if not isinstance(token_ids, np.ndarray):
        return np.frombuffer(array.array("q", token_ids), dtype=np.int64)
    if token_ids.ndim != 1:
        raise ValueError(f"token ids are one-dimensional, got {token_ids.ndim} dimensions")
    if len(token_ids) == 0:
        return np.zeros(0, dtype=np.int64)  # np.array([]) is float64: an empty prompt all the same
    if not np.issubdtype(token_ids.dtype, np.integer):
        raise TypeError(f"token ids are integers, got {token_ids.dtype}")
    return token_ids


def blocked_by(a: Compatibility, b: Compatibility) -> tuple[str, ...]:
    """Return the fields of REUSE_FIELDS on which two records differ, in that order: any of them
    means nothing is reused, whatever the tokens. An empty salt counts as no salt."""
    differ = [name for name in REUSE_FIELDS if getattr(a, name) != getattr(b, name)]
    if "tenant_salt" in differ and (a.tenant_salt or None) == (b.tenant_salt or None):
        differ.remove("tenant_salt")
    return tuple(differ)


def _notes(a: Compatibility, b: Compatibility, edits_exact: bool, max_edit_distance: int) -> tuple[str, ...]:
    """Readable remarks on noted-field differences and an inexact edit. No prompt text."""
    notes = [
        f"{name} differs ({getattr(a, name)!r} vs {getattr(b, name)!r}): reuse still follows the token ids"
        for name in NOTED_FIELDS
        if getattr(a, name) != getattr(b, name)
    ]
    if not edits_exact:
        notes.append(
            f"the prompts differ by more than {max_edit_distance} inserted or deleted tokens "
            "after the first divergence: the edit is shown as one span"
        )
    return tuple(notes)


# -- hash-only records -------------------------------------------------------------------


def shared_leading_blocks(a_hashes: Sequence[int], b_hashes: Sequence[int]) -> int:
    """Return how many leading blocks two block hash chains share (equal hashes, in order).

    Each hash covers every token before it, and the salt and LoRA adapter too, so this is the
    prefix vLLM could reuse between the two prompts, to the block. 0 when either is empty.
    """
    shared = 0
    for a_hash, b_hash in zip(a_hashes, b_hashes, strict=False):
        if a_hash != b_hash:
            break
        shared += 1
    return shared


@dataclass(frozen=True, slots=True)
class BlockMatch:
    """Two recorded prompts compared by their stored block hashes alone: exact to the block.

    ``matching_blocks``: leading blocks with equal hashes (the salt is inside the hashes).
    The first differing token lies in block ``matching_blocks`` (unless all blocks match).
    ``reusable_tokens``, ``wasted_prefill_tokens`` and ``blocked_by`` as in a Divergence.
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
        """The block holding the first differing token; None when every block matches."""
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
    """Compare a later prompt ``b`` with a cached prompt ``a`` by their block hash chains
    (hash-only retention): the same verdict as ``compare_prompts``, to the block."""
    blocked = blocked_by(a_compatibility, b_compatibility)
    matching = shared_leading_blocks(a_hashes, b_hashes)
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
