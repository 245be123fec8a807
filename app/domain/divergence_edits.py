"""Where two token sequences differ: common prefix, common suffix, and the edit between.

The divergence engine (``app.domain.divergence``) needs three answers for prompts of up
to 128K tokens, in a few milliseconds: how many leading tokens two prompts share, how
many trailing ones, and which spans were inserted, deleted or replaced in between, so
that a reader sees "6 tokens were inserted at token 4" rather than "everything after
token 4 differs".

The algorithm, in three steps:

1. The common prefix and the common suffix, vectorised with numpy: one element-wise
   comparison each, O(n) but about 0.1 ms for 128K tokens.
2. What remains between them, the *middle*, is diffed with Myers' O((N+M)D) algorithm
   (the one GNU diff and git use; N, M the middle lengths, D the edit distance, counted
   in inserted plus deleted tokens, so a replaced token counts 2). Runs of equal tokens
   ("snakes") are followed by galloping slice comparisons in numpy, so a long identical
   stretch inside the middle costs O(its length) vectorised, not a Python loop.
3. The minimal edit script is grouped into spans: consecutive deletions and insertions
   with no equal token between them form one span, and two spans separated by an equal
   run no longer than either of them are merged into one (diff-match-patch's semantic
   cleanup rule), so that a newline matching by chance inside a rewritten question does
   not split it. The spans are then no longer strictly minimal, but still exact: applying
   them to the first sequence gives the second.

Bounds: the search stops once D would exceed ``max_distance`` (``MAX_EDIT_DISTANCE``
by default), and the middle is then reported as one replaced span, flagged as inexact.
The Python work before giving up is about D**2 / 2 steps plus the snakes, a few
milliseconds at the default bound (bench/bench_divergence.py measures it). A minimal
script is not always the one a person would write: where several alignments are
equally short (a repeated token inserted next to itself), Myers picks one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

TokenArray: TypeAlias = npt.NDArray[np.integer[Any]]
"""A one-dimensional array of token ids."""

MAX_EDIT_DISTANCE: Final = 128
"""Default bound on the inserted plus deleted tokens that Myers' search explores."""

_FIRST_GALLOP: Final = 16  # tokens compared by the first vectorised step of a snake


class EditKind(StrEnum):
    """What happened to a span of tokens between the first and the second sequence."""

    INSERTED = "inserted"
    DELETED = "deleted"
    REPLACED = "replaced"


@dataclass(frozen=True, slots=True)
class Edit:
    """One span that differs: ``a[a_start:a_end]`` became ``b[b_start:b_end]``.

    Indices are absolute token positions in each sequence. An insertion has an empty
    ``a`` range (``a_start == a_end``, the position it was inserted before), a deletion
    an empty ``b`` range; a replacement has both non-empty.
    """

    kind: EditKind
    a_start: int
    a_end: int
    b_start: int
    b_end: int

    @property
    def a_tokens(self) -> int:
        """How many tokens of the first sequence the span covers."""
        return self.a_end - self.a_start

    @property
    def b_tokens(self) -> int:
        """How many tokens of the second sequence the span covers."""
        return self.b_end - self.b_start


@dataclass(frozen=True, slots=True)
class EditScript:
    """The edits between two sequences, and whether they are the minimal script.

    ``exact`` is False when the edit distance passed the bound: ``edits`` is then one
    replaced (or inserted/deleted) span covering everything between the common prefix
    and the common suffix.
    """

    edits: tuple[Edit, ...]
    exact: bool


def common_prefix_length(a: TokenArray, b: TokenArray) -> int:
    """Return how many leading tokens ``a`` and ``b`` share (0 when either is empty)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differs = a[:n] != b[:n]
    first = int(differs.argmax())
    return first if differs[first] else n


def common_suffix_length(a: TokenArray, b: TokenArray, limit: int) -> int:
    """Return how many trailing tokens ``a`` and ``b`` share, at most ``limit``.

    Callers pass ``min(len(a), len(b)) - common_prefix`` as the limit, so that prefix and
    suffix never overlap. Raises ValueError for a limit outside 0..min(len(a), len(b)).
    """
    if not 0 <= limit <= min(len(a), len(b)):
        raise ValueError(f"the suffix limit must be within both sequences, got {limit}")
    if limit == 0:
        return 0
    return common_prefix_length(a[len(a) - limit :][::-1], b[len(b) - limit :][::-1])


def edit_script(a: TokenArray, b: TokenArray, *, max_distance: int = MAX_EDIT_DISTANCE) -> EditScript:
    """Return the spans where ``a`` and ``b`` differ, in order; no edits when they are equal.

    The common prefix and suffix are trimmed first, and Myers' algorithm diffs only the
    middle. When the middle needs more than ``max_distance`` inserted plus deleted
    tokens, it is reported as one span with ``exact=False`` (see the module docstring).
    Raises ValueError for a negative ``max_distance``.
    """
    if max_distance < 0:
        raise ValueError(f"max_distance cannot be negative, got {max_distance}")
    prefix = common_prefix_length(a, b)
    suffix = common_suffix_length(a, b, min(len(a), len(b)) - prefix)
    a_mid, b_mid = a[prefix : len(a) - suffix], b[prefix : len(b) - suffix]
    if len(a_mid) == 0 or len(b_mid) == 0:
        return EditScript(edits=_spans([(0, len(a_mid), 0, len(b_mid))], prefix), exact=True)
    moves = _myers_moves(a_mid, b_mid, max_distance)
    if moves is None:
        return EditScript(edits=_spans([(0, len(a_mid), 0, len(b_mid))], prefix), exact=False)
    return EditScript(edits=_spans(moves, prefix), exact=True)


def _spans(moves: list[tuple[int, int, int, int]], offset: int) -> tuple[Edit, ...]:
    """Turn moves ``(a_start, a_end, b_start, b_end)``, in order, into edits shifted by ``offset``.

    Touching moves form one span; spans then absorb their neighbours across a short
    equal run (``_absorbs``).
    """
    merged: list[tuple[int, int, int, int]] = []
    for span in _touching(moves):
        if merged and _absorbs(merged[-1], span):
            merged[-1] = (merged[-1][0], span[1], merged[-1][2], span[3])
        else:
            merged.append(span)
    return tuple(
        Edit(
            _kind(a_end - a_start, b_end - b_start),
            a_start + offset,
            a_end + offset,
            b_start + offset,
            b_end + offset,
        )
        for a_start, a_end, b_start, b_end in merged
    )


def _touching(moves: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Merge moves that touch (no equal token between them); drop empty ones."""
    spans: list[tuple[int, int, int, int]] = []
    for a_start, a_end, b_start, b_end in moves:
        if a_start == a_end and b_start == b_end:
            continue
        if spans and spans[-1][1] == a_start and spans[-1][3] == b_start:
            spans[-1] = (spans[-1][0], a_end, spans[-1][2], b_end)
        else:
            spans.append((a_start, a_end, b_start, b_end))
    return spans


def _absorbs(span: tuple[int, int, int, int], after: tuple[int, int, int, int]) -> bool:
    """Whether two spans with an equal run between them read better as one.

    They do when the run is no longer than either span (diff-match-patch's semantic
    cleanup rule): a common token such as a newline that happens to match inside a
    rewritten passage does not split it in two.
    """
    gap = after[0] - span[1]
    return gap <= max(span[1] - span[0], span[3] - span[2]) and gap <= max(
        after[1] - after[0], after[3] - after[2]
    )


def _kind(a_tokens: int, b_tokens: int) -> EditKind:
    if a_tokens == 0:
        return EditKind.INSERTED
    return EditKind.DELETED if b_tokens == 0 else EditKind.REPLACED


def _snake(a: TokenArray, b: TokenArray, x: int, y: int) -> int:
    """Return the length of the run of equal tokens starting at ``a[x]`` and ``b[y]``.

    Most calls end at the first token; a longer run is compared in doubling numpy
    slices, so a run of length L costs O(L) vectorised work and O(log L) Python steps.
    """
    limit = min(len(a) - x, len(b) - y)
    if limit <= 0 or a[x] != b[y]:
        return 0
    run, step = 1, _FIRST_GALLOP
    while run < limit:
        size = min(step, limit - run)
        differs = a[x + run : x + run + size] != b[y + run : y + run + size]
        first = int(differs.argmax())
        if differs[first]:
            return run + first
        run, step = run + size, step * 2
    return run


def _myers_moves(a: TokenArray, b: TokenArray, max_distance: int) -> list[tuple[int, int, int, int]] | None:
    """Return a minimal script as single-token moves, or None past ``max_distance``."""
    n, m = len(a), len(b)
    if abs(n - m) > max_distance:
        return None  # the distance is at least the difference in length
    frontier: dict[int, int] = {1: 0}
    trace: list[dict[int, int]] = []
    for depth in range(max_distance + 1):
        trace.append(frontier.copy())
        for diagonal in range(-depth, depth + 1, 2):
            x = _step(frontier, depth, diagonal)
            x += _snake(a, b, x, x - diagonal)
            frontier[diagonal] = x
            if x >= n and x - diagonal >= m:
                return _backtrack(trace, n, m)
    return None


def _takes_insertion(frontier: dict[int, int], depth: int, diagonal: int) -> bool:
    """Whether the furthest path onto ``diagonal`` comes down from ``diagonal + 1``."""
    return diagonal == -depth or (diagonal != depth and frontier[diagonal - 1] < frontier[diagonal + 1])


def _step(frontier: dict[int, int], depth: int, diagonal: int) -> int:
    """Return x after the one edit that reaches ``diagonal`` furthest at this depth."""
    if _takes_insertion(frontier, depth, diagonal):
        return frontier[diagonal + 1]
    return frontier[diagonal - 1] + 1


def _backtrack(trace: list[dict[int, int]], n: int, m: int) -> list[tuple[int, int, int, int]]:
    """Walk the saved frontiers back from (n, m); return the edit moves in order.

    Each move is one inserted token ``(x, x, y, y + 1)`` or one deleted token
    ``(x, x + 1, y, y)``; the equal runs between them are skipped.
    """
    moves: list[tuple[int, int, int, int]] = []
    x, y = n, m
    for depth in range(len(trace) - 1, 0, -1):
        frontier, diagonal = trace[depth], x - y
        inserted = _takes_insertion(frontier, depth, diagonal)
        prev_x = frontier[diagonal + 1 if inserted else diagonal - 1]
        prev_y = prev_x - (diagonal + 1 if inserted else diagonal - 1)
        moves.append(
            (prev_x, prev_x, prev_y, prev_y + 1) if inserted else (prev_x, prev_x + 1, prev_y, prev_y)
        )
        x, y = prev_x, prev_y
    moves.reverse()
    return moves
