"""The fleet's blocks as its KV events move them, replayed in time order: what each server holds in
GPU memory (per data-parallel rank), what its lower tiers hold, what it evicted and when, what it
held before a restart, and which blocks the fleet has seen at all.

The miss-cause replay (app/domain/misscauses.py FleetHistory) applies the events here and asks,
for each block a request did not reuse, where it was at the request's arrival. Pure: the caller
feeds events in order of time.

Residency is the GPU tier (medium "GPU" or none) of the server's attention group (`attention`:
server -> its full-attention KV-cache group, app/domain/tiers.py attention_group; group 0 where its
events named no kinds): hybrid models send one event per group with the same hashes, the attention
group need not be the first, and a sliding-window or Mamba group's removals say nothing of the
attention blocks a prefix is reused from. Other groups' events are left out, and so is a removal
of a request's own blocks as it ended (released, aborted: app/domain/tiers.py); one that says
demoted leaves the blocks held by a lower tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum
from itertools import repeat

from app.domain.evictions import Eviction, Evictions
from app.domain.generations import Generations
from app.domain.leading import leading
from app.domain.tiers import (
    FALLBACK_ATTENTION_GROUP,
    LowerTiers,
    RemovalReason,
    is_attention,
    is_gpu,
    takes_cached_blocks,
)


class EventKind(IntEnum):
    """As app.traffic.models.KVEvent.Kind."""

    STORED = 1
    REMOVED = 2
    CLEARED = 3


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """One block of one KV event (block_hash None for AllBlocksCleared)."""

    server: int
    rank: int
    epoch: int
    at: datetime
    kind: EventKind
    block_hash: int | None
    medium: str = ""  # the tier: "" or "GPU" for the engine's own cache, else a lower tier's name
    group: int | None = None  # the KV-cache group (None: the only one)
    reason: int | None = None  # a removal's RemovalReason (None: not said)


@dataclass(frozen=True, slots=True)
class Removed:
    """Blocks one event took from a server's GPU memory (none another rank of it still holds), each
    stored at its `stored_at` (None: before the replayed events began), at `at`."""

    server: int
    blocks: Sequence[int]
    stored_at: list[datetime | None]
    at: datetime


class FleetBlocks:
    """Resident blocks per server and rank, lower tiers, evictions, earlier epochs and the blocks
    seen, as the events applied so far left them. `attention`: server -> the KV-cache group its
    prefix is reused from (servers not listed: 0)."""

    def __init__(self, attention: dict[int, int] | None = None) -> None:
        self.attention = dict(attention or {})
        self.resident: dict[int, dict[int, datetime]] = {}  # server -> block -> stored at
        self._ranks: dict[int, dict[int, set[int]]] = {}  # server -> rank -> its resident blocks
        self.lower = LowerTiers()  # what lower tiers (CPU, LMCache ...) hold, apart from GPU memory
        self._epochs: dict[tuple[int, int], int] = {}
        # What was seen forgets, by generations (`turn`): these grow with the traffic, not the caches.
        self.evicted: dict[int, Evictions] = {}  # server -> block -> last eviction
        self.earlier_epochs: dict[int, Generations[int, bool]] = {}  # server -> blocks before a restart
        self.last_removed = Evictions()  # block -> last eviction anywhere
        self.seen: Generations[int, bool] = Generations()  # stored, or in a diagnosed request's chain

    def turn(self) -> None:
        """Forget what was seen or evicted and not seen again since the last turn."""
        self.seen.turn()
        self.last_removed.turn()
        for evicted in self.evicted.values():
            evicted.turn()
        for earlier in self.earlier_epochs.values():
            earlier.turn()

    def eviction(self, server: int, block: int) -> Eviction | None:
        """The block's last eviction from the server in its current epoch, None when none."""
        here = self.evicted.get(server)
        return here.get(block) if here is not None else None

    def apply_blocks(
        self, server: int, rank: int, epoch: int, at: datetime, kind: EventKind, hashes: Sequence[int],
        *, medium: str = "", group: int | None = None, reason: int | None = None,
    ) -> Removed | None:  # fmt: skip
        """The blocks of one KV event at once (module docstring: which are left out). A new epoch
        of a (server, rank) empties what it held first. Returns what it took from GPU memory."""
        stream = (server, rank)
        if epoch != self._epochs.setdefault(stream, epoch):
            self._epochs[stream] = epoch
            self._restart(server, rank)
        if not is_attention(group, self.attention.get(server, FALLBACK_ATTENTION_GROUP)):
            return None
        if kind == EventKind.REMOVED and not takes_cached_blocks(reason):
            return None
        if not is_gpu(medium):
            self._apply_lower(server, rank, medium, kind, hashes)
            return None
        if kind == EventKind.STORED:
            self._store(server, rank, hashes, at=at)
            return None
        if kind == EventKind.CLEARED:
            return self._remove(server, rank, list(self._held(server, rank)), at=at)
        if reason == RemovalReason.DEMOTED:
            self.lower.demote(server, rank, hashes)
        return self._remove(server, rank, hashes, at=at)

    def _apply_lower(
        self, server: int, rank: int, medium: str, kind: EventKind, hashes: Sequence[int]
    ) -> None:
        if kind == EventKind.STORED:
            self.lower.store(server, rank, medium, hashes)
            self.seen.write_all(hashes, True)
        elif kind == EventKind.REMOVED:
            self.lower.remove(server, rank, medium, hashes)
        else:
            self.lower.clear(server, rank, medium)

    def _held(self, server: int, rank: int) -> set[int]:
        return self._ranks.setdefault(server, {}).setdefault(rank, set())

    def _store(self, server: int, rank: int, blocks: Sequence[int], *, at: datetime) -> None:
        # Set and dict operations over the whole event, not a Python step per block: an event
        # stores dozens, and the fleet's events outnumber its requests.
        resident = self.resident.setdefault(server, {})
        resident.update(dict.fromkeys(set(blocks).difference(resident), at))  # kept: when first stored
        self._held(server, rank).update(blocks)
        self.seen.write_all(blocks, True)

    def _remove(self, server: int, rank: int, blocks: Sequence[int], *, at: datetime) -> Removed:
        """Blocks removed; one stored before the replayed events began is evicted all the same
        (when it was stored is then unknown)."""
        ranks = self._ranks.setdefault(server, {})
        self._held(server, rank).difference_update(blocks)
        if len(ranks) > 1:  # a copy another rank of the server still holds stays
            blocks = [block for block in blocks if not any(block in other for other in ranks.values())]
        stored_at = list(map(self.resident.get(server, {}).pop, blocks, repeat(None)))
        self.evicted.setdefault(server, Evictions(server)).write(blocks, server, stored_at, at)
        self.last_removed.write(blocks, server, stored_at, at)
        self.seen.write_all(blocks, True)
        return Removed(server, blocks, stored_at, at)

    def _restart(self, server: int, rank: int) -> None:
        """A new process: all the old one held, or had evicted, was seen in an earlier epoch."""
        self.lower.restart(server, rank)
        earlier = self.earlier_epochs.setdefault(server, Generations())
        earlier.write_all(self.evicted.pop(server, Evictions(server)).blocks(), True)
        resident = self.resident.get(server, {})
        for block in self._ranks.get(server, {}).pop(rank, set()):
            earlier[block] = True
            resident.pop(block, None)

    def resident_anywhere(self, block: int) -> bool:
        """Whether any server holds the block in GPU memory."""
        return any(block in blocks for blocks in self.resident.values())

    def write_seen(self, blocks: Sequence[int]) -> None:
        """Blocks seen in a request's chain (it computed and stored them). Its leading run seen in
        the new generation already is left as it is (seen is only ever written True)."""
        self.seen.write_all(blocks[leading(blocks, self.seen.new) :], True)
