"""The blocks each server evicted, and when: what the miss-cause replay (app/domain/fleetblocks.py)
remembers so that a block later missed can be said evicted, where and after how long."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TypeAlias

from app.domain.generations import Generations

Eviction: TypeAlias = tuple[int, datetime | None, datetime]
"""A block's removal: (server, stored at or None when before the replayed events began, removed at)."""


class Evictions:
    """Blocks' last removals, kept as mappings of plain values rather than one of `Eviction`
    tuples: the history holds a million of them, and a dict holding tuples is one the garbage
    collector walks, entry by entry, at each of its full collections (a quarter of the replay's
    time); one holding only ints and datetimes it does not track. The tuple is built when read.
    `server`: the one server all removals are from, None when each block's is kept."""

    __slots__ = ("_one_server", "_removed_at", "_server", "_stored_at")

    def __init__(self, server: int | None = None) -> None:
        self._one_server = server
        self._removed_at: Generations[int, datetime] = Generations()
        self._server: Generations[int, int] = Generations()
        self._stored_at: Generations[int, datetime | None] = Generations()

    def write(
        self, blocks: Sequence[int], server: int, stored_at: list[datetime | None], at: datetime
    ) -> None:
        """The blocks' latest removal (into the newest generation), each stored at its `stored_at`."""
        self._removed_at.write_all(blocks, at)
        if self._one_server is None:
            self._server.write_all(blocks, server)
        self._stored_at.new.update(zip(blocks, stored_at, strict=True))

    def get(self, block: int) -> Eviction | None:
        removed_at = self._removed_at.get(block)
        if removed_at is None:
            return None
        server = self._one_server if self._one_server is not None else self._server.get(block)
        assert server is not None  # written together, turned together
        return server, self._stored_at.get(block), removed_at

    def blocks(self) -> Iterator[int]:
        return iter(self._removed_at)

    def turn(self) -> None:
        self._removed_at.turn()
        self._server.turn()
        self._stored_at.turn()
