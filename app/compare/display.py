"""What the Compare page shows, prepared for its templates: pure, no Django, no I/O.

The two prompts are drawn as one stream in the later prompt's (b's) positions: the tokens
both share once, and at each edit the tokens of a that went (deleted) and those of b that came
(inserted). A stretch longer than MIN_FOLD tokens folds into one line, snapped to block
boundaries, leaving CONTEXT tokens visible at each end; opening a fold shows CHUNK tokens and
folds the rest again. So the page holds a few hundred chips whatever the prompts' length.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import ClassVar, Final

from app.domain.blocks import full_blocks
from app.domain.divergence import Divergence, TokenIds

CONTEXT: Final = 32  # tokens shown at each end of a folded stretch
MIN_FOLD: Final = 128  # a stretch folds only when that hides at least this many tokens
CHUNK: Final = 512  # tokens an opened fold shows; the rest folds again
ALIGN_LIMIT: Final = 128  # folds snap to block boundaries when blocks are at most this long

TextsOf = Callable[[int, int], list[str]]
"""The readable texts of tokens ``[start, end)`` of one side."""


@cache
def _byte_of() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's bytes_to_unicode) mapped back to bytes."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {byte: chr(byte) for byte in printable}
    shifted = (byte for byte in range(256) if byte not in chars)
    chars |= {byte: chr(256 + n) for n, byte in enumerate(shifted)}
    return {char: byte for byte, char in chars.items()}


def readable(token_str: str) -> str:
    """The text a vocabulary string stands for: byte-level BPE (``"Ġthe"``, ``"Ċ"``) decoded, and
    SentencePiece's ``"▁"`` and byte tokens (``"<0x0A>"``) turned back into spaces and bytes.

    A token holding part of a multi-byte character shows its bytes as ``\\xe2``.
    """
    if len(token_str) == 6 and token_str.startswith("<0x") and token_str.endswith(">"):
        try:
            return bytes([int(token_str[3:5], 16)]).decode("utf-8", errors="backslashreplace")
        except ValueError:
            return token_str
    byte_of = _byte_of()
    if all(char in byte_of for char in token_str):
        return bytes(byte_of[char] for char in token_str).decode("utf-8", errors="backslashreplace")
    return token_str.replace("▁", " ")


def chip_text(text: str) -> tuple[str, bool]:
    """How a token's text shows in a chip, and whether a line break follows it.

    Newlines and tabs become visible marks; a token of whitespace alone shows its spaces as dots
    and other whitespace as code points (``⟨U+00A0⟩``): the page drops whitespace between tags.
    """
    shown = text.replace("\r", "␍").replace("\n", "↵").replace("\t", "⇥")
    if shown.isspace():
        shown = "".join("·" if char == " " else f"⟨U+{ord(char):04X}⟩" for char in shown)
    return shown or "∅", text.endswith("\n")


@dataclass(frozen=True, slots=True)
class Chip:
    """One token. ``css``: its role (reuse, same, after, ins, del) and ``tail`` in a partial block;
    ``block``: the block that starts at it, if one does."""

    is_fold: ClassVar[bool] = False
    side: str
    index: int
    token_id: int
    text: str
    css: str
    block: int | None
    newline: bool
    first: bool
    anchor: str = ""  # the id of the fold it opened, on an opened fold's first chip


@dataclass(frozen=True, slots=True)
class Fold:
    """Tokens ``[start, end)`` of one side, folded into one line that opens on demand."""

    is_fold: ClassVar[bool] = True
    side: str
    start: int
    end: int
    label: str
    css: str

    @property
    def dom_id(self) -> str:
        return f"fold-{self.side}-{self.start}"

    @property
    def last(self) -> int:
        return self.end - 1

    @property
    def query(self) -> str:
        """The permalink query that opens this fold."""
        return f"side={self.side}&start={self.start}&end={self.end}"


Piece = Chip | Fold


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch both prompts share (``equal``: drawn once, in b's positions) or one edit."""

    kind: str
    a_start: int
    a_end: int
    b_start: int
    b_end: int
    a_run: tuple[Piece, ...]
    b_run: tuple[Piece, ...]
    edit: int | None
    label: str


@dataclass(frozen=True, slots=True)
class Bar:
    """A band or a tick of the overview bar, in percent of b's length."""

    left: float
    width: float
    css: str
    title: str
    href: str = ""


@dataclass(frozen=True, slots=True)
class Reveal:
    """A fold to show open when the page is loaded without htmx (the fold link's href)."""

    side: str
    start: int
    end: int


class Layout:
    """Lays out a Divergence as segments of chips and folds. ``texts``: each side's TextsOf;
    ``ids``: each side's token ids (anything indexable by position)."""

    def __init__(
        self, divergence: Divergence, ids: Mapping[str, TokenIds], texts: Mapping[str, TextsOf]
    ) -> None:
        self.d = divergence
        self.ids = ids
        self.texts = texts
        self.length = {"a": divergence.a_length, "b": divergence.b_length}
        size = divergence.block_size
        self.tail_start = {side: full_blocks(n, size) * size for side, n in self.length.items()}
        self.edit_b_starts = [edit.b_start for edit in divergence.edits]
        first = divergence.edits[0] if divergence.edits else None
        self.first: tuple[str, int] | None = None
        if first is not None:
            self.first = ("b", first.b_start) if first.b_end > first.b_start else ("a", first.a_start)

    # --- segments ------------------------------------------------------------------------

    def segments(self, reveal: Reveal | None = None) -> list[Segment]:
        """The stream, in order: shared stretches and edits, long stretches folded."""
        out = []
        for kind, a0, a1, b0, b1, edit in self._spans():
            if edit is None:
                run = self._run("b", b0, b1, reveal)
                out.append(Segment(kind, a0, a1, b0, b1, (), run, None, ""))
            else:
                a_run = self._run("a", a0, a1, reveal) if a1 > a0 else ()
                b_run = self._run("b", b0, b1, reveal) if b1 > b0 else ()
                label = edit_label(kind, a0, a1, b0, b1)
                if edit == 0 and self.d.first_divergence is not None:
                    label = f"first divergence at token {self.d.first_divergence:,}: {label}"
                out.append(Segment(kind, a0, a1, b0, b1, a_run, b_run, edit, label))
        return out

    def _spans(self) -> list[tuple[str, int, int, int, int, int | None]]:
        spans: list[tuple[str, int, int, int, int, int | None]] = []
        a = b = 0
        for index, edit in enumerate(self.d.edits):
            if edit.a_start > a:
                spans.append(("equal", a, edit.a_start, b, edit.b_start, None))
            spans.append((str(edit.kind), edit.a_start, edit.a_end, edit.b_start, edit.b_end, index))
            a, b = edit.a_end, edit.b_end
        if a < self.d.a_length:
            spans.append(("equal", a, self.d.a_length, b, self.d.b_length, None))
        return spans

    def _run(self, side: str, start: int, end: int, reveal: Reveal | None) -> tuple[Piece, ...]:
        """Tokens ``[start, end)`` with the middle folded when it is long (opened by ``reveal``)."""
        fold = self._fold_range(start + CONTEXT, end - CONTEXT)
        if fold is None:
            return self.chips(side, start, end)
        lo, hi = fold
        if reveal is not None and reveal.side == side and lo <= reveal.start < hi:
            middle = (
                *self._fold_or_chips(side, lo, reveal.start),
                *self.expand(side, reveal.start, min(reveal.end, hi)),
                *self._fold_or_chips(side, min(reveal.end, hi), hi),
            )
        else:
            middle = (self.fold(side, lo, hi),)
        return (*self.chips(side, start, lo), *middle, *self.chips(side, hi, end))

    def _fold_range(self, lo: int, hi: int) -> tuple[int, int] | None:
        size = self.d.block_size
        if size <= ALIGN_LIMIT:
            lo, hi = -(-lo // size) * size, hi // size * size
        return (lo, hi) if hi - lo >= MIN_FOLD else None

    def _fold_or_chips(self, side: str, start: int, end: int) -> tuple[Piece, ...]:
        if end - start >= MIN_FOLD:
            return (self.fold(side, start, end),)
        return self.chips(side, start, end)

    def expand(self, side: str, start: int, end: int) -> tuple[Piece, ...]:
        """An opened fold: its first CHUNK tokens, the rest folded again (unless that is short)."""
        stop = end if end - start < CHUNK + MIN_FOLD else start + CHUNK
        chips = self.chips(side, start, stop)
        if chips and not chips[0].first:
            chips = (replace(chips[0], anchor=f"fold-{side}-{start}"), *chips[1:])
        return (*chips, *self._fold_or_chips(side, stop, end))

    # --- chips and folds -------------------------------------------------------------------

    def chips(self, side: str, start: int, end: int) -> tuple[Chip, ...]:
        if end <= start:
            return ()
        texts = self.texts[side](start, end)
        size = self.d.block_size
        chips = []
        for offset, text in enumerate(texts):
            index = start + offset
            shown, newline = chip_text(text)
            chips.append(
                Chip(
                    side=side,
                    index=index,
                    token_id=int(self.ids[side][index]),
                    text=shown,
                    css=self.css(side, index),
                    block=index // size if index % size == 0 else None,
                    newline=newline,
                    first=self.first == (side, index),
                )
            )
        return tuple(chips)

    def fold(self, side: str, start: int, end: int) -> Fold:
        size, css = self.d.block_size, self.css(side, start).split()[0]
        blocks = max(0, end // size - -(-start // size))
        what, why = _FOLD_WORDS[css]
        label = f"{end - start:,} {what}, {blocks:,} block{'s' if blocks != 1 else ''}{why}"
        return Fold(side=side, start=start, end=end, label=label, css=css)

    def css(self, side: str, index: int) -> str:
        """A token's role: ``reuse`` (reusable), ``same`` (shared but recomputed), ``after`` (equal
        again after the divergence), ``ins`` / ``del`` (in an edit); ``tail`` in a partial block."""
        if side == "a":
            role = "del"
        elif index < self.d.reusable_tokens:
            role = "reuse"
        elif index < self.d.common_prefix:
            role = "same"
        elif self._in_edit(index):
            role = "ins"
        else:
            role = "after"
        return role + " tail" if index >= self.tail_start[side] else role

    def _in_edit(self, b_index: int) -> bool:
        position = bisect.bisect_right(self.edit_b_starts, b_index) - 1
        return position >= 0 and b_index < self.d.edits[position].b_end

    def in_range(self, side: str, start: int, end: int) -> bool:
        """Whether ``[start, end)`` is a non-empty range of that side's tokens."""
        return side in self.length and 0 <= start < end <= self.length[side]

    # --- overview --------------------------------------------------------------------------

    def bar(self) -> list[Bar]:
        """Bands (reusable, shared but recomputed, the rest, the partial tail) and a tick per edit."""
        n = max(self.d.b_length, 1)
        d = self.d
        bands = [
            Bar(
                0, 100 * d.reusable_tokens / n, "reuse", f"reusable: tokens 0\u2013{d.reusable_tokens - 1:,}"
            ),
            Bar(
                100 * d.reusable_tokens / n,
                100 * (min(d.common_prefix, d.b_length) - d.reusable_tokens) / n,
                "same",
                "shared, recomputed",
            ),
            Bar(
                100 * self.tail_start["b"] / n,
                100 * (d.b_length - self.tail_start["b"]) / n,
                "tail",
                "partial tail",
            ),
        ]
        ticks = [
            Bar(100 * edit.b_start / n, 0, "tick", f"{edit.kind} at b {edit.b_start:,}", f"#edit-{index}")
            for index, edit in enumerate(d.edits)
        ]
        return [band for band in bands if band.width > 0] + ticks


_FOLD_WORDS: Final = {
    "reuse": ("identical tokens", " (reusable)"),
    "same": ("identical tokens", " (shared, recomputed)"),
    "after": ("identical tokens", " (recomputed: after the divergence)"),
    "ins": ("more tokens only in b", ""),
    "del": ("more tokens only in a", ""),
}


def edit_label(kind: str, a0: int, a1: int, b0: int, b1: int) -> str:
    """``replaced a 12-15 (4 tokens) by b 12-14 (3 tokens)``, in 0-based token positions."""
    a_part = f"a {_span(a0, a1)} ({_count(a1 - a0)})"
    b_part = f"b {_span(b0, b1)} ({_count(b1 - b0)})"
    if kind == "inserted":
        return f"inserted {b_part} before a {a0:,}"
    if kind == "deleted":
        return f"deleted {a_part} before b {b0:,}"
    return f"replaced {a_part} by {b_part}"


def _span(start: int, end: int) -> str:
    return f"{start:,}" if end - start == 1 else f"{start:,}\u2013{end - 1:,}"


def _count(tokens: int) -> str:
    return f"{tokens:,} token{'s' if tokens != 1 else ''}"
