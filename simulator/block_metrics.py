"""vLLM's KV block residency metrics (--kv-cache-metrics), fed by the simulated block pool.

As vLLM 0.32's KVCacheMetricsCollector (vllm/v1/core/kv_cache_metrics.py, called by its BlockPool): a
block is sampled when it is allocated (with probability `sample`, its --kv-cache-metrics-sample); a
prefix hit on it is an access; when a sampled block is taken from the free queue again, cached or not
(vLLM calls on_block_evicted before it looks at the hash), it observes the block's lifetime (allocation
to then), its idle time (from its last access, or its allocation) and the gaps between its last four
accesses. Replaying the captured traffic so observes what the real server did: 61 lifetimes and idle
times for its 44 BlockRemoved, and 15 reuse gaps (tests/simulator/test_cache.py).
"""

import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

ACCESSES_KEPT = 4  # vLLM's deque(maxlen=4): at most three reuse gaps per eviction


@dataclass(slots=True)
class _Sampled:
    born: float
    last_access: float
    accesses: deque[float] = field(default_factory=lambda: deque(maxlen=ACCESSES_KEPT))


@dataclass(frozen=True, slots=True)
class Eviction:
    """What one sampled block's eviction observes, in seconds."""

    lifetime: float
    idle: float
    reuse_gaps: list[float]


class BlockMetrics:
    """Per sampled block id, when it was allocated and last accessed; evictions reported to `observe`."""

    def __init__(
        self, observe: Callable[[Eviction], None], *, sample: float, clock: Callable[[], float], seed: int = 0
    ) -> None:
        if not 0 < sample <= 1:
            raise ValueError(f"the sample rate must be in (0, 1], got {sample}")
        self.observe = observe
        self.sample = sample
        self.clock = clock
        self.random = random.Random(seed)
        self.blocks: dict[int, _Sampled] = {}

    def allocated(self, block_id: int) -> None:
        if self.random.random() < self.sample:
            now = self.clock()
            self.blocks[block_id] = _Sampled(born=now, last_access=now)

    def accessed(self, block_id: int) -> None:
        if (state := self.blocks.get(block_id)) is not None:
            state.last_access = self.clock()
            state.accesses.append(state.last_access)

    def evicted(self, block_id: int) -> None:
        state = self.blocks.pop(block_id, None)
        if state is None:
            return
        now = self.clock()
        gaps = [later - earlier for earlier, later in itertools.pairwise(state.accesses)]
        self.observe(Eviction(now - state.born, now - state.last_access, gaps))

    def reset(self) -> None:
        """The prefix cache was reset: nothing sampled is observed."""
        self.blocks.clear()
