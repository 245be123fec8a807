"""Eviction thrashing: blocks a server removed and then stored again within a short window.

A block stored again minutes after its eviction was still wanted: the cache is too small for the
working set (or something evicts it early), and every such block was prefilled twice.
"""

from dataclasses import dataclass, field


@dataclass(slots=True)
class RecentRemovals:
    """The blocks one stream removed within the last `window_seconds`, by hash, with the time.

    Memory is bounded by the removals of one window; `prune` drops the older ones.
    """

    window_seconds: float
    removed_at: dict[int, float] = field(default_factory=dict)

    def removed(self, block_hash: int, at: float) -> None:
        self.removed_at[block_hash] = at

    def stored(self, block_hash: int, at: float) -> bool:
        """True when the block was removed within the window before `at` (a thrash)."""
        when = self.removed_at.pop(block_hash, None)
        return when is not None and 0 <= at - when <= self.window_seconds

    def prune(self, now: float) -> None:
        """Forget removals older than the window (called now and then, not per event)."""
        horizon = now - self.window_seconds
        self.removed_at = {h: at for h, at in self.removed_at.items() if at >= horizon}
