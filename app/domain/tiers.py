"""Where a server's cached blocks live besides GPU memory: its lower tiers (CPU, disk, LMCache ...).

vLLM's prefix cache is the GPU tier; its offloading connector publishes the blocks it copies to a
lower tier on the same KV-event stream with another `medium` ("CPU", "STORAGE"), and LMCache or
SGLang's hierarchical cache do the same with their own names. A block removed from GPU memory that a
lower tier still holds is demoted (reloadable), not gone. Each (data-parallel rank, medium) is a
space of its own: one tier's removal never touches another's copy of the same hash. Of a hybrid
model's KV-cache groups only the attention group's events are the prefix's blocks (attention_group:
learned per server from the kinds its events name).

A removal may say why (SGLang #39620's reason, decoded by collectors/kv_events/parse.py):
- evicted, cleared, unknown, or none said: the blocks are gone from that tier (the diagnosis's
  `evicted`, or `demoted` where a lower tier holds them), as before the reason existed;
- demoted: gone from GPU memory into a lower tier, reloadable: `demoted` even when no lower
  tier's BlockStored was seen (SGLang's host tier may name none); the block counts as held by an
  unnamed lower tier of the rank until a lower tier of it removes or clears it, or it restarts;
- released, aborted: a request's own blocks freed as it ended (finished, or cancelled), the ones
  the cache did not keep: SGLang frees a finished request's KV beyond what its radix tree holds,
  which may hash like a block the tree still caches. Such a removal takes no cached block away,
  so residency, the block index and eviction counts ignore it.
Only evicted, demoted and unknown (or unsaid) removals are capacity pressure (the thrash tally).

Pure: fed in time order by app/domain/fleetblocks.py FleetBlocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum

FALLBACK_ATTENTION_GROUP = 0
"""The attention group of a server whose events have not named their groups' kinds: the only
group (events without `group_idx`), or vLLM's group 0 as older builds and one-group models have it."""

FULL_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
"""The `kv_cache_spec_kind`s of groups that hold every token's KV, so a prefix's blocks: vLLM's
KVCacheSpecKind values for FullAttentionSpec and its subclasses MLAAttentionSpec and
SinkFullAttentionSpec (vllm/v1/kv_cache_interface.py, get_kv_cache_spec_kind). Sliding-window,
chunked-local, Mamba, encoder-only and cross-attention groups keep only part of a prompt, or none."""

GPU = "GPU"
"""The medium of the engine's own prefix cache; KV events without one are the GPU's too."""

UNNAMED_LOWER_TIER = "lower tier"
"""Where a block demoted without a lower tier's BlockStored is held: a tier of the rank unnamed."""


class RemovalReason(IntEnum):
    """Why a KV event removed blocks, as stored (traffic_kvevent.removal_reason; NULL, here None:
    not said); the wire's names are collectors/kv_events/parse.py RemovalReason's."""

    UNKNOWN = 0
    EVICTED = 1
    DEMOTED = 2
    RELEASED = 3
    ABORTED = 4
    CLEARED = 5


NOT_CACHED = frozenset({RemovalReason.RELEASED, RemovalReason.ABORTED})
"""Reasons of removals that take no cached block away: a request's own blocks freed as it ended."""
_PRESSURE = frozenset({RemovalReason.EVICTED, RemovalReason.DEMOTED, RemovalReason.UNKNOWN})


def takes_cached_blocks(reason: int | None) -> bool:
    """Whether a removal of this reason takes cached blocks away (not a request's own blocks freed
    as it ended: module docstring)."""
    return reason not in NOT_CACHED


def is_pressure(reason: int | None) -> bool:
    """Whether a removal of this reason is the cache making room (capacity pressure), or may be:
    not a request's end, nor an explicit clear."""
    return reason is None or reason in _PRESSURE


def attention_group(kinds: Mapping[int, str | None]) -> int:
    """The KV-cache group a request's prefix is reused from, given the kinds the server's
    BlockStored events named per group index (`kv_cache_spec_kind`): the lowest full-attention
    one. A hybrid model sends one event per group with the same hashes, and its attention group
    need not be group 0 (a model whose first layers are Mamba or sliding-window numbers those
    first). FALLBACK_ATTENTION_GROUP when no event named a full-attention kind (none named any:
    an older vLLM, or a one-group model of another kind, which is group 0)."""
    full = [group for group, kind in kinds.items() if kind in FULL_ATTENTION_KINDS]
    return min(full) if full else FALLBACK_ATTENTION_GROUP


def is_gpu(medium: str | None) -> bool:
    """Whether blocks of this KV-event medium are the engine's own prefix cache (GPU memory, or
    the device's on a CPU build): vLLM sends "GPU" there, older versions and simulators nothing."""
    return not medium or medium.upper() == GPU


def is_attention(group: int | None, attention: int = FALLBACK_ATTENTION_GROUP) -> bool:
    """Whether a KV event of this group (None on the wire: the only one) is of the server's
    attention group (`attention`, from attention_group): another group's events say nothing of
    the attention blocks, so they are kept apart."""
    return group is None or group == attention


def is_residency(medium: str | None, group: int | None, attention: int = FALLBACK_ATTENTION_GROUP) -> bool:
    """Whether a KV event of this medium and group moves the blocks a request's prefix is reused
    from: the GPU tier of the server's attention group (`attention`, from attention_group)."""
    return is_gpu(medium) and is_attention(group, attention)


class LowerTiers:
    """The blocks each server's lower tiers hold, per (rank, medium). Set operations per event."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[int, dict[tuple[int, str], set[int]]] = {}  # server -> (rank, medium) -> blocks

    def _space(self, server: int, rank: int, medium: str) -> set[int]:
        return self._held.setdefault(server, {}).setdefault((rank, medium), set())

    def store(self, server: int, rank: int, medium: str, blocks: Iterable[int]) -> None:
        self._space(server, rank, medium).update(blocks)

    def demote(self, server: int, rank: int, blocks: Iterable[int]) -> None:
        """Blocks a removal said were demoted, whichever lower tier took them (UNNAMED_LOWER_TIER)."""
        self.store(server, rank, UNNAMED_LOWER_TIER, blocks)

    def remove(self, server: int, rank: int, medium: str, blocks: Iterable[int]) -> None:
        """A lower tier dropped blocks: a demoted copy of them is gone too (it may have been there)."""
        blocks = list(blocks)
        self._space(server, rank, medium).difference_update(blocks)
        self._space(server, rank, UNNAMED_LOWER_TIER).difference_update(blocks)

    def clear(self, server: int, rank: int, medium: str) -> None:
        self._space(server, rank, medium).clear()
        self._space(server, rank, UNNAMED_LOWER_TIER).clear()

    def restart(self, server: int, rank: int) -> None:
        """A new process of the rank: what its tiers held in memory went with the old one."""
        for (held_rank, _), blocks in self._held.get(server, {}).items():
            if held_rank == rank:
                blocks.clear()

    def holder(self, server: int, block: int) -> str | None:
        """The medium of a lower tier of the server that holds the block (the first one named, in
        the order seen), None when none does."""
        for (_, medium), blocks in self._held.get(server, {}).items():
            if block in blocks:
                return medium
        return None

    def blocks(self, server: int) -> int:
        """How many blocks the server's lower tiers hold (a block held by two counts twice)."""
        return sum(len(blocks) for blocks in self._held.get(server, {}).values())
