"""What a diagnosis answers about one request: its cause (or why it has none), the runs of tokens it
lost and to what, and its funnel; the labels people read them by, and the losses' stored form.
The replay that finds them is app/domain/misscauses.py."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import NotRequired, TypedDict


class Cause(StrEnum):
    PROMPT_CHANGED = "prompt_changed"
    EVICTED = "evicted"
    ROUTED_ELSEWHERE = "routed_elsewhere"
    SALT = "salt"
    RESTARTED = "restarted"
    BELOW_BLOCK = "below_block"
    COLD = "cold"
    UNEXPLAINED = "unexplained"
    NO_KV_EVENTS = "no_kv_events"
    # The request's own content past its family's usual fan-out point: never reusable, not a loss.
    NEW_CONTENT = "new_content"
    # Gone from GPU memory but still held by a lower tier (CPU, LMCache): reloadable, not gone.
    DEMOTED = "demoted"
    # Hosted APIs (app/diagnosis reads their usage): what the providers document.
    BELOW_MINIMUM = "below_minimum"  # shorter than the provider's minimum cacheable prompt: not a loss
    TTL_LAPSED = "ttl_lapsed"  # the identical prefix was last sent longer ago than the cache keeps it
    BEYOND_LOOKBACK = "beyond_lookback"  # the cached prefix lies before the provider's lookback window
    MARKER_ABSENT = "marker_absent"  # no cache marker (cache_control / cachePoint) reached the provider
    CACHE_KEY_CHANGED = "cache_key_changed"  # the prompt_cache_key differs from the prefix's last one


# Tokens no cache could ever have reused: counted apart from the losses (regressions, killers, the
# lost-token rollups and costs read the losses only). One place says which; every reader asks it.
NOT_LOSSES = frozenset({Cause.BELOW_BLOCK, Cause.NEW_CONTENT, Cause.BELOW_MINIMUM})


def is_loss(cause: str) -> bool:
    """Whether tokens of this cause (a Cause or its value) were reusable and lost."""
    return cause not in NOT_LOSSES


# The two hit rates every page states, each with its definition beside it.
OF_PROMPT = "reused / all prompt tokens"
OF_REUSABLE = (
    "reused / reusable prompt tokens: all prompt tokens less each request's own new content past its "
    "template's usual fan-out point and its tail below one block"
)
# A server's, a tenant's or the fleet's regressions: their templates' commits are the templates'
# regressions, never theirs, so what their prompts changed is left out with what was never reusable.
OF_UNCHANGED = (
    "reused / reusable prompt tokens less those lost to prompt changes (a template's commit is its "
    "template's regression, not its server's, tenant's or fleet's)"
)


# The other figures called a hit rate, each said where it is shown (pages, API answers): what it is
# the share of, and of which requests. Hosted APIs report no reuse of their own but a cache read.
OF_HOSTED = "a hosted API's requests: cache read / input tokens, as their provider reports them"
HOSTED_INCLUDED = f"hosted-API requests included ({OF_HOSTED.partition(': ')[2]})"
OF_RECORDED = (
    f"cached / prompt tokens of the recorded requests that reported cached tokens; {HOSTED_INCLUDED}"
)
OF_COUNTERS = (
    "the engine's own prefix-cache counters (vLLM /metrics): tokens hit / tokens queried, every request"
)
OF_REQUEST = "this request's cached / prompt tokens (a hosted API's: cache read / input tokens)"
OF_REPLAYED = (
    "reused / prompt tokens of the requests replayed through Prefixscope's model of the engine's cache"
)
GATEWAY_CACHE = "requests a gateway answered from its semantic cache: no engine saw them, never prefix reuse"
# By the name the API answers carry (`hit_rate_definition` says which one a figure is).
HIT_RATE_DEFINITIONS = {
    "of_prompt": OF_PROMPT,
    "of_reusable": OF_REUSABLE,
    "of_unchanged": OF_UNCHANGED,
    "recorded": OF_RECORDED,
    "counters": OF_COUNTERS,
    "request": OF_REQUEST,
    "replayed": OF_REPLAYED,
    "hosted": OF_HOSTED,
}


def reusable_hit_rate(*, prompt_tokens: int, reused_tokens: int, by_cause: dict[str, int]) -> float | None:
    """Reused over the prompt tokens a cache could have reused (OF_REUSABLE); None without any."""
    reusable = prompt_tokens - sum(tokens for cause, tokens in by_cause.items() if not is_loss(cause))
    return min(reused_tokens, reusable) / reusable if reusable > 0 else None


class RequestPart(StrEnum):
    """The part of a request that changed where its prompt departs (prompt_changed): what the
    chat template rendered there, compared with the request it departs from."""

    SYSTEM = "system"
    TOOLS = "tools"
    TOOL_CHOICE = "tool_choice"
    RESPONSE_FORMAT = "response_format"
    REASONING_EFFORT = "reasoning_effort"
    TEMPLATE_KWARGS = "template_kwargs"  # chat_template_kwargs other than reasoning effort
    HISTORY = "history"  # earlier turns edited (compacted, summarized), not appended to
    MESSAGES = "messages"  # the latest messages
    MODEL = "model"
    ADAPTER = "adapter"


class Unknown(StrEnum):
    """Why a request has no diagnosis: what its record lacks."""

    NO_PROMPT = "no_prompt"  # no token ids, so no block hashes (a span alone, or hash-less ingest)
    NO_CACHED_TOKENS = "no_cached_tokens"  # the source did not say what was reused
    NO_BLOCK_SIZE = "no_block_size"  # the server's block size is not known yet


# How pages, lists and the stored choices (app/traffic/models/diagnosis.py) name each cause: one
# edit here for a new one.
CAUSE_LABELS: dict[Cause, str] = {
    Cause.PROMPT_CHANGED: "Prompt changed",
    Cause.EVICTED: "Evicted",
    Cause.ROUTED_ELSEWHERE: "Routed elsewhere",
    Cause.SALT: "Tenant salt",
    Cause.RESTARTED: "Server restarted",
    Cause.BELOW_BLOCK: "Shorter than one block",
    Cause.COLD: "Cold (never seen)",
    Cause.UNEXPLAINED: "Unexplained (resident, still missed)",
    Cause.NO_KV_EVENTS: "No KV events from this server",
    Cause.NEW_CONTENT: "New content (not a loss)",
    Cause.DEMOTED: "Demoted to a lower tier (reloadable)",
    Cause.BELOW_MINIMUM: "Below the provider's minimum (not a loss)",
    Cause.TTL_LAPSED: "Cache time-to-live lapsed",
    Cause.BEYOND_LOOKBACK: "Beyond the provider's lookback",
    Cause.MARKER_ABSENT: "Cache marker absent",
    Cause.CACHE_KEY_CHANGED: "Prompt cache key changed",
}

PART_LABELS: dict[RequestPart, str] = {
    RequestPart.SYSTEM: "System message",
    RequestPart.TOOLS: "Tools",
    RequestPart.TOOL_CHOICE: "Tool choice",
    RequestPart.RESPONSE_FORMAT: "Response format",
    RequestPart.REASONING_EFFORT: "Reasoning effort",
    RequestPart.TEMPLATE_KWARGS: "Chat-template arguments",
    RequestPart.HISTORY: "Conversation history rewritten",
    RequestPart.MESSAGES: "Latest messages",
    RequestPart.MODEL: "Model",
    RequestPart.ADAPTER: "LoRA adapter",
}


UNKNOWN_LABELS: dict[Unknown, str] = {
    Unknown.NO_PROMPT: "No prompt token ids (a span alone)",
    Unknown.NO_CACHED_TOKENS: "Cached tokens not reported",
    Unknown.NO_BLOCK_SIZE: "Block size of the server unknown",
}


_LABELS_BY_VALUE = {cause.value: label for cause, label in CAUSE_LABELS.items()}


def cause_label(cause: str) -> str:
    """The label of a cause given by its value; a value that names no cause, as itself."""
    return _LABELS_BY_VALUE.get(cause, cause)


class LossJson(TypedDict):
    """A Loss as stored (a diagnosis row's `losses`) and as the API answers it: the keys that do not
    apply are left out, moments are ISO 8601 text."""

    cause: str
    first_token: int
    tokens: int
    server_id: NotRequired[int]
    server_tokens: NotRequired[int]
    stored_at: NotRequired[str]
    removed_at: NotRequired[str]


@dataclass(frozen=True, slots=True)
class Loss:
    """A run of consecutive blocks lost to one cause (or the tail below one block)."""

    cause: Cause
    first_token: int
    tokens: int
    server: int | None = None  # routed_elsewhere: the server holding it; evicted: where it lived
    server_tokens: int | None = None  # routed_elsewhere: the prompt's leading tokens that server held
    stored_at: datetime | None = None  # evicted: when the block had been stored
    removed_at: datetime | None = None  # evicted: when it was removed

    @property
    def end(self) -> int:
        """The token after its last."""
        return self.first_token + self.tokens

    def holds(self, token: int) -> bool:
        return self.first_token <= token < self.end

    def to_json(self) -> LossJson:
        """As stored: what `from_json` reads back equal."""
        found = LossJson(cause=self.cause.value, first_token=self.first_token, tokens=self.tokens)
        if self.server is not None:
            found["server_id"] = self.server
        if self.server_tokens is not None:
            found["server_tokens"] = self.server_tokens
        if self.stored_at is not None:
            found["stored_at"] = self.stored_at.isoformat()
        if self.removed_at is not None:
            found["removed_at"] = self.removed_at.isoformat()
        return found

    @classmethod
    def from_json(cls, stored: LossJson) -> Loss:
        """A loss as `to_json` wrote it."""
        stored_at, removed_at = stored.get("stored_at"), stored.get("removed_at")
        return cls(
            cause=Cause(stored["cause"]),
            first_token=stored["first_token"],
            tokens=stored["tokens"],
            server=stored.get("server_id"),
            server_tokens=stored.get("server_tokens"),
            stored_at=datetime.fromisoformat(stored_at) if stored_at is not None else None,
            removed_at=datetime.fromisoformat(removed_at) if removed_at is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Funnel:
    """The prompt's tokens at each step to reuse; each step's tokens are leading tokens."""

    prompt_tokens: int
    seen_before: int  # under its salt anywhere before (an unlimited cache with ideal routing)
    resident_anywhere: int  # on the compatible server holding most of it at arrival
    resident_here: int  # on the server it was routed to, at arrival
    reused: int  # what vLLM reported (cached tokens)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    cause: Cause | None  # the one that lost the most reusable tokens; None when all that could be was
    diverged_at: int | None  # prompt_changed: the first token departing from the closest earlier prompt
    losses: tuple[Loss, ...]
    funnel: Funnel
    unexpected_hit: bool
    # prompt_changed, where the request's part digests are known (app/domain/requestparts.py): the
    # part that changed from the earlier request it departs from, how (tools), and that request's key.
    changed_part: RequestPart | None = None
    part_detail: str = ""
    compared_with: Hashable = None

    def tokens_by_cause(self) -> dict[Cause, int]:
        found: dict[Cause, int] = {}
        for loss in self.losses:
            found[loss.cause] = found.get(loss.cause, 0) + loss.tokens
        return found


def reusable_blocks(prompt_tokens: int, block_size: int) -> int:
    """Blocks vLLM may reuse of a prompt: never its last token, so never a block holding it."""
    return max(prompt_tokens - 1, 0) // block_size
