"""What ``find_killers`` takes and gives: prompts, thresholds, killers, their classes and suggestions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from app.domain.blockhash import TokenIds

Decode: TypeAlias = Callable[[Sequence[int]], str]
"""Token ids to text: a server's /detokenize or the configured tokenizer, passed in by the caller."""

Ints: TypeAlias = npt.NDArray[np.int64]


class KillerClass(StrEnum):
    """What kind of text varies at a killer."""

    TIMESTAMP = "timestamp"
    ID = "id"
    NUMBER = "number"
    REORDERED_ITEMS = "reordered_items"
    JSON_KEY_ORDER = "json_key_order"
    WHITESPACE_DRIFT = "whitespace_drift"
    PER_USER = "per_user"
    ROTATING_EXAMPLES = "rotating_examples"
    VARYING_TEXT = "varying_text"  # text was seen, and it is none of the above
    UNCLASSIFIED = "unclassified"  # no text to look at: hash-only mode, or no decoder


SUGGESTIONS: Final[dict[KillerClass, str]] = {
    KillerClass.TIMESTAMP: "Move the timestamp below the stable part of the prompt, or round it to the hour.",
    KillerClass.ID: "Move the request or trace id out of the prompt, or below its stable part.",
    KillerClass.NUMBER: "Move the changing number below the stable part of the prompt.",
    KillerClass.REORDERED_ITEMS: "Sort the items (tools, retrieved chunks) by a stable key before rendering.",
    KillerClass.JSON_KEY_ORDER: "Serialize the JSON with sort_keys=True and fixed separators.",
    KillerClass.WHITESPACE_DRIFT: "Normalize whitespace (trailing spaces, blank lines) before rendering.",
    KillerClass.PER_USER: "Move the per-user data below the shared part, or into the user message.",
    KillerClass.ROTATING_EXAMPLES: "Use one fixed set of examples, or move them below the stable part.",
    KillerClass.VARYING_TEXT: "Move the varying text below the stable part of the prompt.",
    KillerClass.UNCLASSIFIED: "Read the text at this block (hash-only mode has none); move what varies down.",
}
"""One plain suggestion per class."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's prompt, as stored: its block-hash chain (one hash per full block, all signed int64 or
    all uint64 wire values), its token ids when retention keeps them, and its tenant (or user). Lists or
    1-D integer arrays."""

    block_hashes: TokenIds
    token_ids: TokenIds | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class KillerSettings:
    """The thresholds of ``find_killers``; the defaults suit block sizes of 16 to 32.

    A node is a killer when its requests branch there and reach ``min_continuations`` distinct nodes
    ``fanout_window_blocks`` blocks further on (a cascade of two-way choices counts as many ways), at
    least ``min_requests`` of them are affected (lose a block or more), also ``min_affected_share`` of
    the requests through it, and these lose ``min_tokens_lost`` tokens each on average. Only requests
    whose first block unseen in earlier requests lies within ``fanout_window_blocks`` of the node count.
    Token mode: text is "shared structure" when a gram of ``gram_tokens`` tokens of it appears after the
    position in two or more of the node's branches; a request re-converges at its first covered
    run of ``min_stretch_tokens`` and the stretch goes on over gaps up to ``max_gap_tokens``. A divergence
    ``straddle_margin_tokens`` or fewer tokens before a block boundary is a straddle. Costs are measured on
    ``evaluated_requests`` evenly spaced requests (scaled up beyond), shared structure on ``pool_requests``,
    classes on ``classified_requests`` decoded windows of at most ``max_window_tokens`` (plus
    ``lead_tokens`` before the node). ``max_samples`` samples of at most ``sample_chars`` characters.
    Per-user data needs ``min_continuations`` tenants, each taking its own branch.
    """

    min_continuations: int = 3
    min_requests: int = 8
    min_affected_share: float = 0.02
    min_tokens_lost: int = 64
    fanout_window_blocks: int = 8
    gram_tokens: int = 8
    min_stretch_tokens: int = 32
    max_gap_tokens: int = 16
    straddle_margin_tokens: int = 4
    evaluated_requests: int = 256
    pool_requests: int = 64
    classified_requests: int = 24
    max_window_tokens: int = 1024
    lead_tokens: int = 64
    max_samples: int = 5
    sample_chars: int = 80


@dataclass(frozen=True, slots=True)
class Straddle:
    """A divergence just before a block boundary: the ``shared_tokens`` of block ``block_index`` before it
    are identical in every request and recomputed anyway, since vLLM caches whole blocks only."""

    block_index: int
    shared_tokens: int
    block_size: int


@dataclass(frozen=True, slots=True)
class Killer:
    """A fan-out position and its cost. ``position_token`` is None in hash-only mode.

    ``requests_through``: requests sharing the prefix up to the position (less those an earlier killer
    accounts for); ``distinct_continuations``: the distinct nodes they reach ``fanout_window_blocks``
    blocks further on (or at their last block); ``requests_affected`` (losing a block or more) and
    ``tokens_lost``: what the fan-out costs, estimates scaled up from ``evaluated_requests`` requests
    when more are concerned. ``samples``: short texts of the varying line, empty without text;
    ``sample_requests``: the prompts (indices in the ``prompts`` given) they come from, in their order,
    and without text a few affected prompts: the ones to decode again (``sample_texts``) or to show.
    """

    position_token: int | None
    position_block: int
    requests_through: int
    requests_affected: int
    distinct_continuations: int
    tokens_lost: int
    klass: KillerClass
    suggestion: str
    samples: tuple[str, ...]
    sample_requests: tuple[int, ...]
    straddle: Straddle | None
