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
   not split it; a replacement whose shorter side equals one end of its longer side is
   reported as the insertion or deletion it is. The spans are then not always a minimal
   script, but always an exact one: applying them to the first sequence gives the second.

Bounds: the search gives up once D would exceed ``max_distance`` (``MAX_EDIT_DISTANCE``,
128, by default), at once when the middles' lengths differ by more than that, and the
middle is then reported as one replaced span, flagged as inexact. Giving up costs about
D**2 / 2 Python steps (8K at the default) plus the snakes, at most O((N+M)D) vectorised
comparisons: 3 to 4 ms for two unrelated or rotated 128K-token prompts on numpy arrays
(bench/bench_divergence.py). Memory is one frontier of 2D+3 ints per depth. So an edit
near the top plus a rewritten last question of a few dozen tokens is still resolved into
two spans, while two mostly different prompts get one span. A minimal script is not
always the one a person would write: where several alignments are equally short (a
repeated token inserted next to itself), Myers picks one of them.
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
    """The edits between two sequences, and whether the search resolved them.

    ``exact`` is False when the edit distance passed the bound: ``edits`` is then one
    replaced span covering everything between the common prefix and the common suffix.
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
        return EditScript(edits=_spans([(0, len(a_mid), 0, len(b_mid))], a_mid, b_mid, prefix), exact=True)
    moves = _myers_moves(a_mid, b_mid, max_distance)
    if moves is None:
        return EditScript(edits=_spans([(0, len(a_mid), 0, len(b_mid))], a_mid, b_mid, prefix), exact=False)
    return EditScript(edits=_spans(moves, a_mid, b_mid, prefix), exact=True)


def _spans(
    moves: list[tuple[int, int, int, int]], a: TokenArray, b: TokenArray, offset: int
) -> tuple[Edit, ...]:
    """Turn moves ``(a_start, a_end, b_start, b_end)`` in ``a`` and ``b``, in order, into edits
    shifted by ``offset``.

    Touching moves form one span; spans then absorb their neighbours across a short
    equal run (``_absorbs``), and a replacement that is an insertion or a deletion in
    disguise is reported as one (``_unwrap``).
    """
    merged: list[tuple[int, int, int, int]] = []
    for span in _touching(moves):
        if merged and _absorbs(merged[-1], span):
            merged[-1] = (merged[-1][0], span[1], merged[-1][2], span[3])
        else:
            merged.append(span)
    return tuple(_edit(_unwrap(span, a, b), offset) for span in merged)


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


def _unwrap(span: tuple[int, int, int, int], a: TokenArray, b: TokenArray) -> tuple[int, int, int, int]:
    """Return a replaced span as the pure insertion or deletion it may be.

    When the shorter side of a replacement equals the end (or else the start) of the
    longer side, only the rest of the longer side was inserted or deleted: a 6-token
    timestamp whose last token happens to equal the next token of the prompt is read
    as an insertion of 6, not a replacement of 1 by 7.
    """
    a_start, a_end, b_start, b_end = span
    a_len, b_len = a_end - a_start, b_end - b_start
    if 0 < a_len < b_len:
        if np.array_equal(a[a_start:a_end], b[b_end - a_len : b_end]):
            return (a_start, a_start, b_start, b_end - a_len)
        if np.array_equal(a[a_start:a_end], b[b_start : b_start + a_len]):
            return (a_end, a_end, b_start + a_len, b_end)
    if 0 < b_len < a_len:
        if np.array_equal(b[b_start:b_end], a[a_end - b_len : a_end]):
            return (a_start, a_end - b_len, b_start, b_start)
        if np.array_equal(b[b_start:b_end], a[a_start : a_start + b_len]):
            return (a_start + b_len, a_end, b_end, b_end)
    return span


def _edit(span: tuple[int, int, int, int], offset: int) -> Edit:
    """Make an Edit of a span, shifted by ``offset`` (see ``_unwrap`` for its kind)."""
    a_start, a_end, b_start, b_end = (index + offset for index in span)
    if a_start == a_end:
        return Edit(EditKind.INSERTED, a_start, a_end, b_start, b_end)
    if b_start == b_end:
        return Edit(EditKind.DELETED, a_start, a_end, b_start, b_end)
    return Edit(EditKind.REPLACED, a_start, a_end, b_start, b_end)


def _snake(a: TokenArray, b: TokenArray, x: int, y: int) -> int:
    """Return the length of the run of equal tokens starting at ``a[x]`` and ``b[y]``.

    The caller has seen ``a[x] == b[y]``. The rest of the run is compared in doubling
    numpy slices, so a run of length L costs O(L) vectorised work and O(log L) Python steps.
    """
    limit = min(len(a) - x, len(b) - y)
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
    """Return a minimal script as single-token moves, or None past ``max_distance``.

    ``frontier[offset + k]`` is the furthest x reached on diagonal k = x - y; a copy is
    kept per depth for the backtrack. The first comparison of each snake is made here,
    not in ``_snake``, because this loop is the hot path: up to max_distance**2 / 2
    iterations when the search gives up, and most snakes end at their first token.
    """
    n, m = len(a), len(b)
    if abs(n - m) > max_distance:
        return None  # the distance is at least the difference in length
    offset = max_distance + 1
    frontier = [0] * (2 * offset + 1)
    trace: list[list[int]] = []
    for depth in range(max_distance + 1):
        trace.append(frontier.copy())
        for index in range(offset - depth, offset + depth + 1, 2):
            if _takes_insertion(frontier, depth, index - offset, offset):
                x = frontier[index + 1]
            else:
                x = frontier[index - 1] + 1
            y = x - index + offset
            if x < n and y < m and a[x] == b[y]:
                x += _snake(a, b, x, y)
            frontier[index] = x
            if x >= n and x - index + offset >= m:
                return _backtrack(trace, n, m, offset)
    return None


def _takes_insertion(frontier: list[int], depth: int, diagonal: int, offset: int) -> bool:
    """Whether the furthest path onto ``diagonal`` at ``depth`` comes down from ``diagonal + 1``."""
    k = diagonal + offset
    return diagonal == -depth or (diagonal != depth and frontier[k - 1] < frontier[k + 1])


def _backtrack(trace: list[list[int]], n: int, m: int, offset: int) -> list[tuple[int, int, int, int]]:
    """Walk the saved frontiers back from (n, m); return the edit moves in order.

    Each move is one inserted token ``(x, x, y, y + 1)`` or one deleted token
    ``(x, x + 1, y, y)``; the equal runs between them are skipped.
    """
    moves: list[tuple[int, int, int, int]] = []
    x, y = n, m
    for depth in range(len(trace) - 1, 0, -1):
        frontier, diagonal = trace[depth], x - y
        inserted = _takes_insertion(frontier, depth, diagonal, offset)
        prev_diagonal = diagonal + 1 if inserted else diagonal - 1
        prev_x = frontier[prev_diagonal + offset]
        prev_y = prev_x - prev_diagonal
        moves.append(
            (prev_x, prev_x, prev_y, prev_y + 1) if inserted else (prev_x, prev_x + 1, prev_y, prev_y)
        )
        x, y = prev_x, prev_y
    moves.reverse()
    return moves
