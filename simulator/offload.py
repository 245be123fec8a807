"""A lower KV tier behind one simulated engine: vLLM's OffloadingConnector with its CPU backend.

Blocks the GPU pool evicts are copied here (an LRU of `num_blocks`), and the tier publishes what it
stores and drops on the engine's KV-event stream with medium "CPU", in the connector's placeholder
shape (simulator/kv_events.py offloaded_stored). A request whose chain goes on past its GPU hit in
this tier loads those blocks back (`reload`), and vLLM reports them in its cached tokens: its
scheduler adds the connector's external tokens to the local hit (vllm/v1/metrics/stats.py,
num_cached_tokens = num_local_cached_tokens + num_external_cached_tokens).

`reload` False is a connector whose lookups fail: the tier holds the blocks, the engine recomputes
them (the `demoted` cause's ground truth).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from simulator.kv_events import KVEventData, offloaded_removed, offloaded_stored

MEDIUM_CPU = "CPU"


class CpuTier:
    """The blocks a CPU tier of `num_blocks` holds, least recently used first."""

    def __init__(self, num_blocks: int, *, reload: bool = True) -> None:
        """Raises ValueError when num_blocks < 1."""
        if num_blocks < 1:
            raise ValueError("a CPU tier holds at least one block")
        self.num_blocks = num_blocks
        self.reload = reload
        self._held: OrderedDict[Hashable, None] = OrderedDict()
        self.queries = 0  # blocks looked up here (vllm:kv_offload_tiering_block_queries)
        self.hits = 0  # of them, found and loaded (…_block_hits)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def offload(self, key: Hashable) -> list[KVEventData]:
        """Copy an evicted GPU block here; the events that says, a dropped copy's first."""
        events: list[KVEventData] = []
        if key in self._held:
            self._held.move_to_end(key)
            return events
        if len(self._held) >= self.num_blocks:
            dropped, _ = self._held.popitem(last=False)
            events.append(offloaded_removed(dropped.wire, medium=MEDIUM_CPU))  # type: ignore[attr-defined]
        self._held[key] = None
        events.append(offloaded_stored(key.wire, medium=MEDIUM_CPU))  # type: ignore[attr-defined]
        return events

    def load(self, keys: Sequence[Hashable]) -> int:
        """How many of the leading `keys` (the chain past the GPU hit) are loaded from here: the
        run this tier holds, 0 when it does not reload. Counts the lookup as the connector does."""
        run = 0
        for key in keys:
            if key not in self._held:
                break
            run += 1
        self.queries += min(run + 1, len(keys))
        if not self.reload:
            return 0
        self.hits += run
        for key in keys[:run]:
            self._held.move_to_end(key)
        return run

    def clear(self) -> None:
        self._held.clear()
