"""A mapping that forgets what was not written lately: the memory of a history kept for days.

Entries live in two generations. Writes go to the new one; reads look in both; `turn` makes the new
generation the old one and drops the old one's entries that were not written again since. So an
entry written at least once per generation stays, and the memory holds at most two generations'
worth of writes. A read of an old entry through `setdefault` writes it again (it stays).
"""

from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, TypeVar

from app.domain.leading import leading

K = TypeVar("K")
V = TypeVar("V")

_MISSING = object()


class Generations(Generic[K, V]):
    __slots__ = ("new", "old")

    def __init__(self) -> None:
        self.new: dict[K, V] = {}
        self.old: dict[K, V] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.new or key in self.old

    def __iter__(self) -> Iterator[K]:
        yield from self.new
        yield from (key for key in self.old if key not in self.new)

    def __len__(self) -> int:
        return len(self.new) + sum(1 for key in self.old if key not in self.new)

    def get(self, key: K, default: V | None = None) -> V | None:
        found = self.new.get(key, _MISSING)
        if found is _MISSING:
            return self.old.get(key, default)
        return found  # type: ignore[return-value]

    def __setitem__(self, key: K, value: V) -> None:
        self.new[key] = value

    def setdefault(self, key: K, value: V) -> V:
        """The value kept for `key` (written again into the new generation), or `value` written."""
        found = self.new.get(key, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        kept = self.old.get(key, value)
        self.new[key] = kept
        return kept

    def setdefault_all(self, keys: Sequence[K], value: V) -> None:
        """`setdefault` of each key, at once (a prompt's chain is mostly known already: its leading
        run in the new generation is stepped over in C)."""
        new, old = self.new, self.old
        for key in [key for key in keys[leading(keys, new) :] if key not in new]:
            new[key] = old.get(key, value)

    def leading(self, keys: Sequence[K]) -> int:
        """How many of the leading keys are held, one after the other, in either generation: runs
        in the new one are counted at once (app.domain.leading), a key of the old one steps over."""
        held = leading(keys, self.new)
        while held < len(keys) and keys[held] in self.old:
            held += 1 + leading(keys[held + 1 :], self.new)
        return held

    def write_all(self, keys: Iterable[K], value: V) -> None:
        self.new.update(dict.fromkeys(keys, value))

    def pop(self, key: K) -> V | None:
        """Remove `key` from both generations; its newest value, or None."""
        old = self.old.pop(key, None)
        new = self.new.pop(key, None)
        return new if new is not None else old

    def turn(self) -> None:
        """Start a new generation: what was not written since the last turn is forgotten."""
        self.old, self.new = self.new, {}
