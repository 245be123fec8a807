"""Token mode's shared structure: the text a node's branches have in common after it, found with hashed
grams, and how far into a request's tail that text runs (where it re-converges)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from app.domain.killers.values import Ints, KillerSettings

_GRAM_BASE: Final = np.uint64(0x100000001B3)
_NEVER: Final = np.iinfo(np.int64).max


def _grams(tokens: Ints, width: int) -> npt.NDArray[np.uint64]:
    """A hash of every run of ``width`` consecutive tokens (empty when there are fewer tokens)."""
    count = len(tokens) - width + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    values = tokens.astype(np.uint64)
    grams = np.zeros(count, dtype=np.uint64)
    for offset in range(width):
        grams = grams * _GRAM_BASE + values[offset : offset + count]  # wraps around: a hash
    return grams


@dataclass(frozen=True, slots=True)
class SharedText:
    """The grams of a pool of tails (sorted), each with the branch and arrival position of its first
    request and the arrival position of its first request in another branch (``_NEVER`` for none), and
    the branches whose text other branches mostly share (``related``)."""

    grams: npt.NDArray[np.uint64]
    first_branch: Ints
    first_at: Ints
    other_at: Ints
    related: Ints


def index_shared_text(
    tails: list[Ints], branches: Ints, arrivals: Ints, settings: KillerSettings
) -> SharedText:
    """Index the pool's tails (the tokens from the node's first difference on), which requests are
    given in arrival order (``arrivals``) with their branches (next blocks)."""
    grams = [_grams(tail, settings.gram_tokens) for tail in tails]
    lengths = [len(g) for g in grams]
    values = np.concatenate(grams) if grams else np.zeros(0, dtype=np.uint64)
    owners, at = np.repeat(branches, lengths), np.repeat(arrivals, lengths)
    order = np.lexsort((at, values))
    values, owners, at = values[order], owners[order], at[order]
    new = np.concatenate(([True], values[1:] != values[:-1])) if len(values) else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(new)
    gram = np.cumsum(new) - 1
    other = np.flatnonzero(owners != owners[starts][gram])
    other_at = np.full(len(starts), _NEVER, dtype=np.int64)
    found, first_other = np.unique(gram[other], return_index=True)
    other_at[found] = at[other[first_other]]  # rows of a gram come in arrival order
    return SharedText(
        values[starts], owners[starts], at[starts], other_at, _related(owners, other_at[gram] < _NEVER)
    )


def _related(owners: Ints, shared: npt.NDArray[np.bool_]) -> Ints:
    """The branches at least half of whose grams another branch has too: the same text in another
    version or order. A few common phrases (two JSON schemas' ``{"type": "string"}``) do not count."""
    branches, index = np.unique(owners, return_inverse=True)
    share = np.bincount(index, weights=shared, minlength=len(branches)) / np.bincount(
        index, minlength=len(branches)
    )
    return branches[share >= 0.5]


def shared_stretch(tail: Ints, text: SharedText, branch: int, arrival: int, settings: KillerSettings) -> int:
    """How far into ``tail`` (a request's tokens from the node's first difference on) runs the text it
    shares with an earlier request of another branch.

    A token is shared when such a gram covers it. The stretch starts at the first covered run of
    ``min_stretch_tokens`` (the varying span before it may be of any length), goes on over gaps of at
    most ``max_gap_tokens``, and ends with the last covered token before a longer gap. 0 when the tail
    never re-converges: a variation at the end of a prompt, another template, the first request.
    """
    grams = _grams(tail, settings.gram_tokens)
    if not len(grams) or not len(text.grams):
        return 0
    found = np.minimum(np.searchsorted(text.grams, grams), len(text.grams) - 1)
    earlier = np.where(text.first_branch[found] != branch, text.first_at[found], text.other_at[found])
    shared = (text.grams[found] == grams) & (earlier < arrival)
    return _covered_reach(shared, len(tail), settings)


def _covered_reach(shared: npt.NDArray[np.bool_], length: int, settings: KillerSettings) -> int:
    """``shared_stretch`` from the shared grams: where the covered runs that start with a long one end."""
    hits = np.zeros(length + 1, dtype=np.int64)
    hits[1 : len(shared) + 1] = np.cumsum(shared)
    hits[len(shared) + 1 :] = hits[len(shared)]
    lower = np.maximum(np.arange(length) - settings.gram_tokens + 1, 0)
    covered = np.flatnonzero(hits[1:] - hits[lower] > 0)
    if not len(covered):
        return 0
    breaks = np.flatnonzero(np.diff(covered) > 1)
    starts = covered[np.concatenate(([0], breaks + 1))]
    ends = covered[np.concatenate((breaks, [len(covered) - 1]))] + 1
    long_runs = np.flatnonzero(ends - starts >= settings.min_stretch_tokens)
    if not len(long_runs):
        return 0
    first = int(long_runs[0])
    wide_gaps = np.flatnonzero(starts[first + 1 :] - ends[first:-1] > settings.max_gap_tokens)
    last = first + int(wide_gaps[0]) if len(wide_gaps) else len(ends) - 1
    return int(ends[last])
