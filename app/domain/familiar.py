"""The text a template's (or prefix family's) prompts shared, found again where it moved.

A prompt that departs from its family's earlier prompts and then goes on with their shared text
(the system prompt after a timestamp or a request id at the top) departed at a volatile token, not
where its own content starts (app/domain/fanout.py). The volatile span has no fixed length (a time,
then a request id of 8 or 12 digits), so the text after it is shifted off the block boundaries the
block hashes are cut on: it is found by keys cut where the text itself says.

A key is the SHINGLE_TOKENS tokens that start at an anchor, a position chosen by a hash of the two
tokens there (about one in ANCHOR_EVERY), so the same text has its anchors at the same places in it
wherever it stands. Only text an earlier prompt of the family also held (the leading blocks a prompt
shares: its stable part) is learned, never a request's own tail: a question asked before, at the
same place, is the family's own content, and short (FAMILIAR_TOKENS asks for more than a question).
Each key keeps where it was last seen, and counts only at about that place (MAX_SHIFT): a retrieved
passage repeated anywhere in a later prompt is not the text that followed the same departure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.domain.blockhash import TokenIds
from app.domain.leading import leading

SHINGLE_TOKENS = 16  # the tokens one key holds
ANCHOR_EVERY = 8  # about one position in this many starts a key (a power of two)
FAMILIAR_TOKENS = 64  # the family's text a departure goes on with, to be a volatile token's
FAMILIAR_WINDOW = 320  # the tokens after a departure looked at (a volatile span, then the text)
MAX_SHIFT = 256  # how far, in tokens, the text may stand from where the family held it
MEMORY_KEYS = 16_384  # keys per family (about 130,000 tokens of text); then emptied, learned again

_TOKEN = np.dtype("<i8")
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier: spreads the pair's bits
_TOP_BITS = np.uint64(64 - (ANCHOR_EVERY.bit_length() - 1))


class FamiliarText:
    """The keys of one family's shared text, and where each was last seen (a token position)."""

    __slots__ = ("_learned", "_seen_at")

    def __init__(self) -> None:
        self._seen_at: dict[bytes, int] = {}
        self._learned: set[int] = set()  # blocks whose text is learned (a prompt's shared prefix)

    def learn(self, chain: Sequence[int], token_ids: TokenIds | None, shared: int, size: int) -> None:
        """The prompt's first `shared` blocks were held by an earlier prompt of its family: their
        text is the family's. Only blocks not learned before are read (a shared prefix is the
        same blocks request after request: one C loop steps over them)."""
        if token_ids is None or not size or not shared:
            return
        if len(self._seen_at) >= MEMORY_KEYS:  # a chat family's long histories: start again
            self._seen_at.clear()
            self._learned.clear()
        start = leading(chain[:shared], self._learned)
        if start == shared:
            return
        # Keys that crossed the end of what was learned before start up to a key's length earlier.
        first = max(start * size - (SHINGLE_TOKENS - 1), 0)
        tokens = np.asarray(token_ids[first : shared * size], dtype=_TOKEN)
        encoded = tokens.tobytes()
        for at in _anchors(tokens).tolist():
            self._seen_at[encoded[at * _TOKEN.itemsize : (at + SHINGLE_TOKENS) * _TOKEN.itemsize]] = (
                first + at
            )
        self._learned.update(chain[start:shared])

    def familiar(self, token_ids: TokenIds | None, start: int) -> bool:
        """Whether the prompt goes on, within FAMILIAR_WINDOW tokens from `start`, with at least
        FAMILIAR_TOKENS tokens of its family's shared text, each near where the family held it.
        False without token ids (hash-only retention)."""
        if token_ids is None:
            return False
        tokens = np.asarray(token_ids[start : start + FAMILIAR_WINDOW], dtype=_TOKEN)
        encoded = tokens.tobytes()
        covered = end = 0
        for at in _anchors(tokens).tolist():
            seen_at = self._seen_at.get(
                encoded[at * _TOKEN.itemsize : (at + SHINGLE_TOKENS) * _TOKEN.itemsize]
            )
            if seen_at is None or abs(seen_at - (start + at)) > MAX_SHIFT:
                continue
            covered += at + SHINGLE_TOKENS - max(at, end)  # keys overlap: each token counts once
            end = at + SHINGLE_TOKENS
        return covered >= FAMILIAR_TOKENS


def _anchors(tokens: np.ndarray) -> np.ndarray:
    """Where keys start in `tokens`: each position whose two tokens hash into the lowest
    1/ANCHOR_EVERY, and whose key fits."""
    if len(tokens) < SHINGLE_TOKENS:
        return np.empty(0, dtype=np.intp)
    pairs = tokens[:-1].view(np.uint64) * _MIX ^ tokens[1:].view(np.uint64)
    picked = np.flatnonzero((pairs * _MIX) >> _TOP_BITS == 0)
    return picked[picked <= len(tokens) - SHINGLE_TOKENS]
