"""What a run of KV events does to a server's set of resident blocks.

vLLM reports cache contents as a stream: BlockStored adds blocks, BlockRemoved takes them
away (one hash per event when a free cached block is reused), AllBlocksCleared empties the
cache. Applying a whole batch as one net change keeps database writes to one statement each.
A restarted server starts with an empty cache but sends no AllBlocksCleared: its stream starts
a new epoch, and the resident set of an epoch is that epoch's changes alone.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
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
    items = list(changes)
    return net_residency_of_columns(
        [c.change for c in items], [c.block_hash for c in items], [c.parent_hash for c in items]
    )


def net_residency_of_columns(
    changes: Sequence[Change], hashes: Sequence[int | None], parents: Sequence[int | None]
) -> NetResidency:
    """net_residency of the changes given as three columns of one length, in stream order.

    Written for long runs (a collector's flush): only the last clear matters, and after it a dict
    built from (hash, (change, parent)) pairs keeps each block's last change, at C speed.
    A STORED or REMOVED change without a hash changes nothing.
    """
    cleared = Change.CLEARED in changes
    start = len(changes) - list(reversed(changes)).index(Change.CLEARED) if cleared else 0
    last = dict(zip(hashes[start:], zip(changes[start:], parents[start:], strict=True), strict=True))
    return NetResidency(
        cleared=cleared,
        removed={h for h, (change, _) in last.items() if change is Change.REMOVED and h is not None},
        stored={
            h: parent for h, (change, parent) in last.items() if change is Change.STORED and h is not None
        },
    )


def net_residency_of_epoch(net: NetResidency, *, epoch: int, resident_epoch: int | None) -> NetResidency:
    """What `net`, the changes of one stream's `epoch`, does to a resident set built in `resident_epoch`.

    A newer epoch is a new vLLM process: its cache starts empty, so the set is cleared first. An older
    epoch's changes come from a process that is gone and change nothing. `resident_epoch` None: the
    stream has no committed position yet, so nothing of it is resident and `net` applies as it is.
    """
    if resident_epoch is None or epoch == resident_epoch:
        return net
    if epoch < resident_epoch:
        return NetResidency()
    return replace(net, cleared=True)
