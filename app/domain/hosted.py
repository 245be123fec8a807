"""Why a hosted API's prompt cache did not reuse a request's prefix: the causes its provider
documents. Pure. The self-hosted diagnosis (KV events, block hashes) is app/domain/misscauses.py.

A hosted record has no token ids and no KV events: what Prefixscope knows is its usage (tokens read
from and written to the provider's cache), and, when the application sends them, a digest of each
content block of its prompt (`content_chain` chains them, as vLLM chains its blocks) and which blocks
carried a cache marker. Requests are replayed in time order (`HostedHistory`) within one scope (the
provider, model and tenant: a provider's cache is never shared across them).

A request that read nothing from the cache (a request that read some was served what it could; the
rest is its new content) is, in this order of checks:
- `below_minimum`: its prompt is shorter than the provider's minimum cacheable length for its model
  (MINIMUM_TOKENS): never cacheable, not a loss;
- `cold`: no leading content block of it was sent before in its scope (unless it names a template
  whose earlier request in its scope it has part digests to compare with: a reordered tool list
  changes the first block, and is a change, not a first request);
- when the prefix up to its last cache marker (without one: all its content blocks but the last,
  the request's own new content) was sent before:
  `cache_key_changed` (OpenAI) the `prompt_cache_key` differs from the one that prefix was last sent
  under; `ttl_lapsed` that prefix was last sent longer ago than the provider keeps it (the TTL its
  cache write used, as the usage reports it: Anthropic's 5 minutes or 1 hour; else TTL_SECONDS);
  `marker_absent` (Anthropic, Bedrock) no cache marker reached the provider: zero tokens written and
  zero read, or a body with no marker at all (a gateway strips `cache_control` / `cachePoint`);
  `unexplained` otherwise;
- when only a shorter prefix was sent before: `beyond_lookback` (Anthropic and Claude on Bedrock)
  when the last block an earlier request cached lies LOOKBACK_BLOCKS or more blocks before the
  request's last marker (the provider looks back 20 blocks from a marker, no further), `ttl_lapsed`
  when that block's cache had lapsed, `unexplained` when the lookback reached it; `prompt_changed`
  when no earlier request cached any block of that prefix.

A `prompt_changed` request whose record has its parts' digests (app/domain/requestparts.py: a REST
record's request body, a span's content) names the part that changed from the earlier request of its
scope and template it departs from (the latest sharing the most leading content blocks), as a
self-hosted one does.

Tokens: the lost ones are those written to the cache when the shape reports writes (the rest, past
the last marker, is new content), else the whole uncached prompt (OpenAI and Gemini do not say where
their cacheable prefix ends). A partial hit (an earlier marker hit, a later one missed) is not split.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from app.domain.generations import Generations
from app.domain.misses import Cause, Diagnosis, Funnel, Loss, Unknown
from app.domain.requestparts import Parts, RecentParts, changed_part

PARTS_MEMORY_BLOCKS = 256  # content blocks whose request's parts are kept, per scope

# The minimum cacheable prompt, per provider and model (first match of the model's name wins):
# - OpenAI: 1,024 tokens (developers.openai.com/api/docs/guides/prompt-caching).
# - Anthropic, and Claude on Bedrock: 4,096 for Opus 4.5 and later and Haiku 4.5; 2,048 for Sonnet
#   4.6 and Haiku 3 / 3.5; 1,024 for the others (platform.claude.com/docs/en/build-with-claude/
#   prompt-caching; docs.aws.amazon.com/bedrock/latest/userguide/prompt-caching.html).
# - Bedrock's other models (Nova): 1,024 (the same AWS page).
# - Gemini: 2,048 for 2.5, 4,096 for Gemini 3 and later (ai.google.dev/gemini-api/docs/caching,
#   updated 2026-10-13).
_CLAUDE_MINIMUMS = (
    (re.compile(r"opus-(4[-.]([5-9]|\d\d)|[5-9])"), 4096),
    (re.compile(r"haiku-(4[-.]([5-9]|\d\d)|[5-9])"), 4096),
    (re.compile(r"sonnet-(4[-.]([6-9]|\d\d)|[5-9])"), 2048),
    (re.compile(r"3[-.]5-haiku|3-haiku|haiku-3"), 2048),
)
MINIMUM_TOKENS: dict[str, tuple[tuple[re.Pattern[str], int], ...]] = {
    "openai": (),
    "anthropic": _CLAUDE_MINIMUMS,
    "bedrock": _CLAUDE_MINIMUMS,
    "gemini": ((re.compile(r"gemini-2\.5"), 2048), (re.compile(r"gemini-[2-9]"), 4096)),
}
_DEFAULT_MINIMUM = {"openai": 1024, "anthropic": 1024, "bedrock": 1024, "gemini": 4096}

# How long a cached prefix lives after its last use, when the usage does not say. Anthropic and
# Bedrock: 5 minutes by default, 1 hour when the marker asks for it; their usage says which a write
# used (cache_creation, cacheDetails: HostedPrompt.cache_ttl_seconds), and a read refreshes the entry
# for the TTL it was written with. OpenAI: in-memory retention clears it after 5 to 10 minutes of
# inactivity, always within the hour (its prompt-caching guide): past 10 minutes it is taken as
# lapsed. Gemini's implicit cache documents none: never said lapsed.
TTL_SECONDS: dict[str, int | None] = {"openai": 600, "anthropic": 300, "bedrock": 300, "gemini": None}

# Anthropic checks for a cached prefix at a marker and at most 20 content blocks before it
# (platform.claude.com prompt-caching: "the system only checks up to 20 blocks before each explicit
# breakpoint"). Bedrock serves Claude with the same cache.
LOOKBACK_BLOCKS = 20
_MARKED = frozenset({"anthropic", "bedrock"})  # caching needs a marker (cache_control, cachePoint)


def minimum_tokens(provider: str, model: str) -> int:
    """The provider's minimum cacheable prompt for the model (its default for a model not listed)."""
    name = model.lower()
    for pattern, minimum in MINIMUM_TOKENS.get(provider, ()):
        if pattern.search(name):
            return minimum
    return _DEFAULT_MINIMUM.get(provider, 1024)


def _lookback(provider: str, model: str) -> int | None:
    if provider == "anthropic" or (provider == "bedrock" and "claude" in model.lower()):
        return LOOKBACK_BLOCKS
    return None


def content_chain(digests: Sequence[str]) -> list[int]:
    """The chain of a prompt's content-block digests: entry i covers blocks 0..i (as a cache key
    covers everything before its marker), as signed 64-bit integers (the records' block_hashes)."""
    chain: list[int] = []
    parent = b""
    for digest in digests:
        parent = hashlib.blake2b(parent + digest.encode(), digest_size=8).digest()
        chain.append(int.from_bytes(parent, "big", signed=True))
    return chain


@dataclass(frozen=True, slots=True)
class HostedPrompt:
    """What the hosted diagnosis needs of one record."""

    provider: str
    model: str
    arrived_at: datetime
    prompt_tokens: int | None
    cached_tokens: int | None
    cache_write_tokens: int | None  # None: the shape does not report writes (OpenAI, Gemini)
    cache_ttl_seconds: int | None = None  # the TTL its writes used (the longest); None: not reported
    chain: Sequence[int] = ()  # content_chain of its blocks; () when the application sent none
    breakpoints: Sequence[int] | None = None  # blocks with a cache marker; None: the body not described
    cache_key: str = ""  # the prompt_cache_key's hash
    tenant: str = ""
    parts: Parts | None = None  # its parts' digests, when its record has them
    family: Hashable = None  # its template (None: none named): parts compare within one
    key: Hashable = None  # the record's key: the diagnosis of a later request names it (compared_with)

    @property
    def scope(self) -> Hashable:
        return (self.provider, self.model, self.tenant)


@dataclass(frozen=True, slots=True)
class _Sighting:
    at: datetime
    key: str
    ttl: int | None = None  # how long the provider keeps the prefix cached then; None: its default


class HostedHistory:
    """The prefixes hosted requests sent, replayed in time order: `diagnose` each in order."""

    def __init__(self) -> None:
        self._seen: Generations[tuple[Hashable, int], _Sighting] = Generations()
        self._cached: Generations[tuple[Hashable, int], _Sighting] = Generations()  # at markers
        self._parts: Generations[Hashable, RecentParts] = Generations()  # by scope and template

    def turn(self) -> None:
        """Forget what was not sent again since the last turn (see FleetHistory.turn)."""
        self._seen.turn()
        self._cached.turn()
        self._parts.turn()

    def diagnose(self, request: HostedPrompt) -> Diagnosis | Unknown:
        """Why the request's prompt was not read from the provider's cache; then it is remembered."""
        if request.prompt_tokens is None:
            return Unknown.NO_PROMPT
        if request.cached_tokens is None:
            return Unknown.NO_CACHED_TOKENS
        found = self._diagnosed(request, request.prompt_tokens, request.cached_tokens)
        if isinstance(found, Diagnosis) and found.cause == Cause.PROMPT_CHANGED:
            found = self._with_part(request, found)
        self.remember(request)
        return found

    def _with_part(self, request: HostedPrompt, found: Diagnosis) -> Diagnosis:
        """The part that changed, when the request and the one it departs from have their parts."""
        memory = self._parts.get((request.scope, request.family))
        if memory is None or request.parts is None or (compared := memory.compared(request.chain)) is None:
            return found
        change = changed_part(request.parts, compared[1])
        if change is None:
            return replace(found, compared_with=compared[0])
        detail = change.detail.value if change.detail else change.kwarg
        return replace(found, changed_part=change.part, part_detail=detail, compared_with=compared[0])

    def remember(self, request: HostedPrompt) -> None:
        keys = [(request.scope, entry) for entry in request.chain]
        if request.parts is not None:
            parts = self._parts.setdefault((request.scope, request.family), RecentParts(PARTS_MEMORY_BLOCKS))
            parts.remember(request.chain, request.key, request.parts)
        sighting = _Sighting(request.arrived_at, request.cache_key, self._kept_for(request, keys))
        self._seen.write_all(keys, sighting)
        if (request.cached_tokens or 0) + (request.cache_write_tokens or 0) > 0:
            marked = request.breakpoints if request.breakpoints else [len(request.chain) - 1]
            for index in marked:
                if 0 <= index < len(request.chain):
                    self._cached[keys[index]] = sighting

    def _kept_for(self, request: HostedPrompt, keys: list[tuple[Hashable, int]]) -> int | None:
        """How long the provider keeps the request's prefix: the TTL its write used; without a write
        (a read refreshes an entry for the TTL it was written with) the TTL it was last seen with."""
        if request.cache_write_tokens:
            return request.cache_ttl_seconds
        held = self._seen.leading(keys)
        earlier = self._seen.get(keys[held - 1]) if held else None
        return earlier.ttl if earlier is not None else None

    def _diagnosed(self, request: HostedPrompt, prompt: int, cached: int) -> Diagnosis | Unknown:
        if cached > 0:  # served what it could: the rest is its own new content
            tail = [Loss(Cause.NEW_CONTENT, cached, prompt - cached)] if prompt > cached else []
            return _diagnosis(None if not tail else Cause.NEW_CONTENT, tail, prompt, cached, seen=cached)
        if prompt < minimum_tokens(request.provider, request.model):
            return _diagnosis(Cause.BELOW_MINIMUM, [Loss(Cause.BELOW_MINIMUM, 0, prompt)], prompt, 0, seen=0)
        if not request.chain:
            return Unknown.NO_PROMPT
        cause = self._cause(request)
        written = request.cache_write_tokens
        lost = written if written else prompt
        losses = [Loss(cause, 0, lost)]
        if lost < prompt:
            losses.append(Loss(Cause.NEW_CONTENT, lost, prompt - lost))
        return _diagnosis(cause, losses, prompt, 0, seen=0 if cause == Cause.COLD else lost)

    def _cause(self, request: HostedPrompt) -> Cause:
        scope, chain = request.scope, request.chain
        keys = [(scope, entry) for entry in chain]
        held = self._seen.leading(keys)
        if held == 0:
            return Cause.PROMPT_CHANGED if self._template_seen(request) else Cause.COLD
        marks = request.breakpoints
        # The prefix a cache would have held: up to its last marker, else all its blocks but the
        # last (the request's own new content: the question, the latest turn).
        target = max(marks) + 1 if marks else max(len(chain) - 1, 1)
        if held >= target:
            sighting = self._seen.get(keys[target - 1])
            assert sighting is not None
            return self._repeated(request, sighting)
        lookback = _lookback(request.provider, request.model)
        if lookback is not None and marks:
            return self._short_of_marker(request, keys[:target], lookback)
        return Cause.PROMPT_CHANGED

    def _template_seen(self, request: HostedPrompt) -> bool:
        """Whether the request names a template of which its scope had a request with parts."""
        family = request.family
        return family is not None and request.parts is not None and (request.scope, family) in self._parts

    def _repeated(self, request: HostedPrompt, last: _Sighting) -> Cause:
        """The prefix to its last marker was sent before: why it was not read."""
        provider = request.provider
        if provider == "openai" and request.cache_key != last.key:
            return Cause.CACHE_KEY_CHANGED
        if _lapsed(provider, last, request.arrived_at):
            return Cause.TTL_LAPSED
        if provider in _MARKED and (request.cache_write_tokens == 0 or request.breakpoints == []):
            return Cause.MARKER_ABSENT
        return Cause.UNEXPLAINED

    def _short_of_marker(
        self, request: HostedPrompt, keys: list[tuple[Hashable, int]], lookback: int
    ) -> Cause:
        """Only a shorter prefix was sent before: the last block an earlier request cached, if any,
        and whether the provider's lookback from the marker reaches it."""
        for index in range(len(keys) - 1, -1, -1):
            cached = self._cached.get(keys[index])
            if cached is None:
                continue
            if _lapsed(request.provider, cached, request.arrived_at):
                return Cause.TTL_LAPSED
            # Within the lookback and the TTL the provider had it, and did not read it.
            return Cause.BEYOND_LOOKBACK if len(keys) - 1 - index >= lookback else Cause.UNEXPLAINED
        return Cause.PROMPT_CHANGED


def _lapsed(provider: str, last: _Sighting, now: datetime) -> bool:
    """Whether the prefix cached at `last` was gone by `now`: past the TTL it was written with, else
    the provider's default."""
    ttl = last.ttl if last.ttl is not None else TTL_SECONDS.get(provider)
    return ttl is not None and now - last.at > timedelta(seconds=ttl)


def _diagnosis(cause: Cause | None, losses: list[Loss], prompt: int, cached: int, *, seen: int) -> Diagnosis:
    funnel = Funnel(
        prompt_tokens=prompt, seen_before=max(seen, cached), resident_anywhere=cached,
        resident_here=cached, reused=cached,
    )  # fmt: skip
    return Diagnosis(cause=cause, diverged_at=None, losses=tuple(losses), funnel=funnel, unexpected_hit=False)
