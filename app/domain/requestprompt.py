"""One request record as the miss-cause diagnosis reads it (app/domain/misscauses.py)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime

from app.domain.blockhash import TokenIds
from app.domain.hitblock import HitBlock
from app.domain.misses import Unknown
from app.domain.requestparts import Parts


@dataclass(frozen=True, slots=True)
class RequestPrompt:
    """What the diagnosis needs of one request record. Hashes are the stored (signed) values."""

    server: int
    arrived_at: datetime
    block_size: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    block_hashes: Sequence[int]
    salt: str = ""  # the salt's hash, "" for none
    neutral_hashes: Sequence[int] = ()  # the chain without the salt; () when unsalted (the same)
    family: Hashable = None  # the template, or the prefix family; None: neither
    token_ids: TokenIds | None = None  # for a token-exact divergence; None in hash-only mode
    kv_events: bool = True  # whether the server's KV events are collected
    first_token_at: datetime | None = None  # a block removed after arrival but before it was evicted
    key: Hashable = None  # the caller's name for the request, as `revised` gives it back
    effective_block: int | None = (
        None  # hits are multiples of it (a multiple of block_size); None: block_size
    )
    drops_last_block: bool = False  # speculative decoding by EAGLE/MTP: the last matched block is not reused
    parts: Parts | None = None  # its parts' digests (a gateway's chat request), to say which changed

    def hit_block(self, size: int) -> HitBlock:
        """How the server rounds this request's hit (`size`: its block size)."""
        return HitBlock(size, self.effective_block or size, self.drops_last_block)

    def unknown(self) -> Unknown | None:
        """Why the request cannot be diagnosed, or None when it can."""
        if not self.block_size:
            return Unknown.NO_BLOCK_SIZE
        if self.cached_tokens is None:
            return Unknown.NO_CACHED_TOKENS
        if self.prompt_tokens is None or (not self.block_hashes and self.prompt_tokens >= self.block_size):
            return Unknown.NO_PROMPT
        return None
