"""A unified diff's lines, each marked with what the commit did to it, moved lines told apart from
added and removed ones: the version's diff a regression shows as evidence."""

from dataclasses import dataclass
from enum import StrEnum


class LineKind(StrEnum):
    FILE = "file"  # the ---/+++ heads
    HUNK = "hunk"  # @@ ... @@
    CONTEXT = "context"
    ADDED = "added"
    REMOVED = "removed"
    MOVED_FROM = "moved-from"  # removed here, added elsewhere with the same text
    MOVED_TO = "moved-to"  # added here, removed elsewhere with the same text


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One line of the diff as printed (its +/- sign kept) and its kind; a moved line's ``partner``
    is the index, in the same list, of its other end."""

    text: str
    kind: LineKind
    partner: int | None = None


def diff_lines(diff: str) -> list[DiffLine]:
    """The diff's lines, marked (see ``mark_moves`` for what counts as moved)."""
    return mark_moves([DiffLine(line, _kind(line)) for line in diff.splitlines()])


def _kind(line: str) -> LineKind:
    if line.startswith(("+++", "---")):
        return LineKind.FILE
    if line.startswith("+"):
        return LineKind.ADDED
    if line.startswith("-"):
        return LineKind.REMOVED
    if line.startswith("@@"):
        return LineKind.HUNK
    return LineKind.CONTEXT


def mark_moves(lines: list[DiffLine]) -> list[DiffLine]:
    """The lines, with each removed line whose text (whitespace trimmed, not blank) is added
    elsewhere marked moved-from, and that added line moved-to, each naming the other.

    "Elsewhere" leaves out an edit in place: within one run of removed and added lines, the i-th
    removed line and the i-th added line with the same trimmed text are a change of whitespace,
    and stay removed and added. The others pair by text in diff order, each line once (a line
    removed twice and added once: the first removal is the move, the second stays removed).
    """
    in_place = _edited_in_place(lines)
    removed: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        if line.kind == LineKind.REMOVED and i not in in_place and _text(line):
            removed.setdefault(_text(line), []).append(i)
    marked = list(lines)
    for i, line in enumerate(lines):
        waiting = removed.get(_text(line)) if line.kind == LineKind.ADDED and i not in in_place else None
        if waiting:
            origin = waiting.pop(0)
            marked[origin] = DiffLine(lines[origin].text, LineKind.MOVED_FROM, partner=i)
            marked[i] = DiffLine(line.text, LineKind.MOVED_TO, partner=origin)
    return marked


def _text(line: DiffLine) -> str:
    return line.text[1:].strip()


def _edited_in_place(lines: list[DiffLine]) -> set[int]:
    """Indexes of the removed and added lines that only changed whitespace where they stand."""
    found: set[int] = set()
    run: list[int] = []
    for i, line in enumerate([*lines, DiffLine("", LineKind.CONTEXT)]):
        if line.kind in (LineKind.REMOVED, LineKind.ADDED):
            run.append(i)
            continue
        gone = [j for j in run if lines[j].kind == LineKind.REMOVED]
        came = [j for j in run if lines[j].kind == LineKind.ADDED]
        found.update(j for pair in zip(gone, came, strict=False) if _same(lines, *pair) for j in pair)
        run = []
    return found


def _same(lines: list[DiffLine], a: int, b: int) -> bool:
    return _text(lines[a]) == _text(lines[b])
