"""What a run of KV events does to a server's set of resident blocks.

vLLM reports cache contents as a stream: BlockStored adds blocks, BlockRemoved takes them
away (one hash per event when a free cached block is reused), AllBlocksCleared empties the
cache. Applying a whole batch as one net change keeps database writes to one statement each.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum


class Change(Enum):
    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class BlockChange:
    """One block's change, in stream order; `block_hash` is None for CLEARED."""

    change: Change
    block_hash: int | None = None
    parent_hash: int | None = None


@dataclass(slots=True)
class NetResidency:
    """The net effect of a run of changes, to apply in this order.

    `cleared`: empty the resident set first. `removed`: hashes to delete. `stored`: hashes to
    add (with their parent), which never overlap `removed`.
    """

    cleared: bool = False
    removed: set[int] = field(default_factory=set)
    stored: dict[int, int | None] = field(default_factory=dict)


def net_residency(changes: Iterable[BlockChange]) -> NetResidency:
    """Fold changes in stream order: a later change of the same block wins over an earlier one."""
    net = NetResidency()
    for item in changes:
        if item.change is Change.CLEARED:
            net = NetResidency(cleared=True)
        elif item.block_hash is None:
            continue
        elif item.change is Change.STORED:
            net.removed.discard(item.block_hash)
            net.stored[item.block_hash] = item.parent_hash
        else:
            net.stored.pop(item.block_hash, None)
            net.removed.add(item.block_hash)
    return net
