"""What earlier prompts of one template (or prefix family) and salt held: where a prompt departs.

A prompt's `divergence` is the first token where it departs from the earlier prompt it shares the
most leading tokens with (the longest common prefix over all of them, as a brute force over every
earlier prompt would find it). The earlier prompts sharing the most leading full blocks with it are
those holding its block `shared - 1` (each block hash covers every token before it): which is the
run of its chain the memory holds. Within the next block, every distinct block of tokens that
followed that one in earlier prompts (a full block, or a prompt's partial last one) is a candidate;
kept sorted, the one sharing the most leading tokens with the prompt's own sorts next to it, so
two comparisons find it however many there are (a fan-out point: a timestamp, a user's question).

Tokens are kept as int64 bytes, one `bytes` per block where one block followed (a shared prefix,
most of them) and a sorted list only at fan-out points: a container per block is one the garbage
collector walks, and a history holds hundreds of thousands of blocks. Any fixed-width encoding
sorts token sequences in some lexicographic order, which is all the neighbour search needs.

Without token ids (hash-only retention) only the blocks are known: the divergence is block-exact.

It also teaches the text its prompts shared to its template's FamiliarText (app/domain/familiar.py):
a prompt that departs and then goes on with it (the system prompt after a timestamp at the top)
departed at a volatile token, not where its own content starts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict, deque
from typing import TypeAlias

import numpy as np

from app.domain.blockhash import TokenIds
from app.domain.familiar import FamiliarText
from app.domain.leading import leading

FAMILY_MEMORY_BLOCKS = 65_536  # blocks of tokens remembered per template and salt
FOLLOWERS_PER_BLOCK = 1_024  # distinct blocks remembered after one block (a fan-out point)

_TOKEN_BYTES = 8  # a token id remembered as an int64
_LITTLE_INT64 = np.dtype("<i8")  # little-endian on any machine: `_common_tokens` reads it so
_Kept: TypeAlias = bytes | list[bytes]  # the block(s) that followed one block, list: sorted


class Followers:
    """The blocks earlier prompts of one template and salt had, and the tokens that followed each.
    Bounded: past FAMILY_MEMORY_BLOCKS, the blocks not seen for the longest are forgotten first."""

    __slots__ = ("_blocks", "_kept", "_text")

    def __init__(self, text: FamiliarText | None = None) -> None:
        self._blocks: OrderedDict[int | None, _Kept] = OrderedDict()  # None: the prompt's start
        self._kept = 0  # blocks of tokens held, over all blocks
        # The text its prompts shared, wherever it moves: its template's under any salt, when given.
        self._text = text if text is not None else FamiliarText()

    def __len__(self) -> int:
        """Blocks of tokens held (what FAMILY_MEMORY_BLOCKS bounds)."""
        return self._kept

    def remember(self, chain: list[int], token_ids: TokenIds | None, size: int) -> None:
        """Add a prompt: its chain, and for each of its blocks (and its start) the tokens that
        follow it. A known next block is the same tokens after the same parent (its hash covers
        both): only its place in the memory moves, the common case of a shared prefix, done in
        one C loop."""
        blocks = self._blocks
        parents: list[int | None] = [None, *chain]
        known = max(leading(parents, blocks) - 1, 0)  # the last known parent's next block is new
        self._text.learn(chain, token_ids, known, size)  # what an earlier prompt held too
        deque(map(blocks.move_to_end, parents[:known]), maxlen=0)
        tail = (
            b"" if token_ids is None else np.asarray(token_ids[known * size :], dtype=_LITTLE_INT64).tobytes()
        )
        width = size * _TOKEN_BYTES
        for offset, parent in enumerate(parents[known:]):
            index = known + offset
            if index < len(chain) and chain[index] in blocks and parent in blocks:
                blocks.move_to_end(parent)  # a known pair after a forgotten one
                continue
            self._add(parent, tail[offset * width : (offset + 1) * width])
            if offset == 0 and self._add_new(parents[index + 1 :], tail[width:], width):
                break
        while self._kept > FAMILY_MEMORY_BLOCKS:
            _, forgotten = blocks.popitem(last=False)
            self._kept -= 1 if isinstance(forgotten, bytes) else len(forgotten)

    def _add_new(self, parents: list[int | None], tail: bytes, width: int) -> bool:
        """Add a prompt's new tail at once when none of its `parents` is known (and none repeats):
        each is then added as the newest with the tokens after it (what `_add` does of each, a
        Python step per block slower). False, adding nothing, when one is known."""
        blocks = self._blocks
        distinct = set(parents)
        if not width or len(distinct) != len(parents) or not blocks.keys().isdisjoint(distinct):
            return False  # a size unknown (a prompt of no blocks), a repeat or a known block
        following = [tail[at : at + width] for at in range(0, len(parents) * width, width)]
        blocks.update(zip(parents, following, strict=True))
        self._kept += len(parents)
        return True

    def _add(self, parent: int | None, tokens: bytes) -> None:
        """`tokens` followed `parent`: kept unless known (b"": a prompt ended there, or hash-only)."""
        kept = self._blocks.get(parent)
        if kept is None:  # most of a prompt's new blocks: added as the newest already
            self._blocks[parent] = tokens
            self._kept += 1
            return
        if isinstance(kept, bytes):
            if kept != tokens and tokens:
                self._blocks[parent] = sorted((kept, tokens)) if kept else tokens
                self._kept += 1 if kept else 0
        elif tokens:
            self._kept += _insert(kept, tokens)
        self._blocks.move_to_end(parent)

    def divergence(self, chain: list[int], token_ids: TokenIds | None, size: int) -> int:
        """The first token where the prompt departs from the earlier prompt sharing the most
        leading tokens with it: block-exact from the chain, token-exact within the next block
        when the token ids of both sides are known."""
        shared = leading(chain, self._blocks)
        kept = self._blocks.get(chain[shared - 1] if shared else None, b"")
        if token_ids is None or not kept:
            return shared * size
        ours = np.asarray(token_ids[shared * size : (shared + 1) * size], dtype=_LITTLE_INT64).tobytes()
        if isinstance(kept, bytes):
            return shared * size + _common_tokens(ours, kept)
        at = bisect_left(kept, ours)
        return shared * size + max(_common_tokens(ours, theirs) for theirs in kept[max(at - 1, 0) : at + 1])


def _insert(kept: list[bytes], tokens: bytes) -> int:
    """Insert `tokens` into the sorted `kept` unless there; past FOLLOWERS_PER_BLOCK it replaces
    the neighbour sharing the most with it (what that one matched, it mostly matches). Returns
    the change in blocks held."""
    at = bisect_left(kept, tokens)
    if at < len(kept) and kept[at] == tokens:
        return 0
    kept.insert(at, tokens)
    if len(kept) <= FOLLOWERS_PER_BLOCK:
        return 1
    neighbours = [i for i in (at - 1, at + 1) if 0 <= i < len(kept)]
    del kept[max(neighbours, key=lambda i: _common_tokens(tokens, kept[i]))]
    return 0


def _common_tokens(ours: bytes, theirs: bytes) -> int:
    """How many leading tokens two blocks of int64 bytes share: the lowest bit where the two,
    read as little-endian integers, differ is in the first differing token (a numpy comparison
    cost ten times more, most of it making arrays of 16 tokens)."""
    length = min(len(ours), len(theirs))
    differ = int.from_bytes(ours[:length], "little") ^ int.from_bytes(theirs[:length], "little")
    if not differ:
        return length // _TOKEN_BYTES
    return ((differ & -differ).bit_length() - 1) // (_TOKEN_BYTES * 8)
