"""What one source saw of one inference request: the shape every collector produces. Pure.

The gateway, vLLM's and applications' OTLP spans and REST bulk ingest each fill a `RequestFacts`;
the ingest service stores them, merging the facts of one request from several sources into one row.
A request is known by its canonical request id (`canonical_request_id`), whichever source saw it.

`problem` says why facts cannot be stored (a field too long for its column, a character PostgreSQL
refuses, cached tokens above prompt tokens): such a record is rejected alone, with the field named.
"""

import re
from collections.abc import Sequence
from datetime import datetime

import msgspec

from collectors.errors import Rejection, RejectReason
from collectors.parts import PartDigests

# The lengths of the request record's text columns (app/traffic/models.py reads them from here).
REQUEST_ID_MAX = 255
TRACE_ID_MAX = 32
MODEL_MAX = 255
TENANT_MAX = 100
TEMPLATE_MAX = 200
TEMPLATE_VERSION_MAX = 40
SERVER_MAX = 500  # a registered server's name, or its base URL
SALT_MAX = 1024  # vLLM's own bound on cache_salt
PROMPT_BLOCKS_MAX = 4096  # content blocks of one hosted request's prompt (Anthropic allows 4 markers)
DIGEST_MAX = 128  # one content block's digest, as the client wrote it (hex sha-512 at most)

# Hosted APIs whose usage Prefixscope diagnoses by their documented rules (app/domain/hosted.py).
# "" is a self-hosted engine (vLLM), whose KV events and block hashes tell more.
HOSTED_PROVIDERS = ("openai", "anthropic", "bedrock", "gemini")


class RequestFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What one source saw of one request; None or "" where it did not say.

    Two TTFTs, never mixed: `client_ttft_seconds` as the client saw it (the gateway measures it, an
    application may report it), `server_ttft_seconds` as vLLM measured it (its `llm_request` span:
    from the request's arrival in vLLM to its first token, queueing and prefill included).
    """

    # A frozen msgspec Struct rather than a frozen dataclass: a batch builds thousands, and a
    # Struct is built several times faster (the REST endpoint spent more on these than on JSON).

    request_id: str  # canonical: see canonical_request_id
    arrived_at: datetime
    server: str = ""  # a registered server's name or base URL; "" means the sender's own
    trace_id: str = ""
    model: str = ""
    tenant: str = ""
    template: str = ""
    template_version: str = ""  # the template repository's commit sha (or a tag)
    client_ttft_seconds: float | None = None
    server_ttft_seconds: float | None = None
    queue_seconds: float | None = None
    prefill_seconds: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    cache_salt: str | None = None  # hashed by the ingest; the salt itself is never stored
    prompt_token_ids: Sequence[int] | None = None
    # Hosted APIs (a provider of HOSTED_PROVIDERS): what their caches are told and answer.
    provider: str = ""
    cache_write_tokens: int | None = None  # written to the provider's cache; None: not reported
    cache_ttl_seconds: int | None = None  # the longest TTL those writes used; None: not reported
    prompt_cache_key: str | None = None  # OpenAI's prompt_cache_key; hashed by the ingest, never stored
    # The prompt's content blocks (tools, system, messages' parts) in order, each as a digest the
    # client computed (never the text), and which of them carry a cache marker (cache_control,
    # cachePoint): the prefix a hosted cache keys on, and where its lookback starts.
    prompt_blocks: Sequence[str] | None = None
    cache_breakpoints: Sequence[int] | None = None
    # Answered by a gateway's response cache (semantic or exact): the model never saw it.
    gateway_cache_hit: bool | None = None
    parts: PartDigests | None = None  # the gateway's digests of a chat request's parts (collectors/parts.py)


# vLLM 0.32 (vllm/entrypoints/openai/*/serving.py) names a request after the client's X-Request-Id
# header, or a random id when there is none (`_base_request_id`), and prefixes it per endpoint:
# `cmpl-<id>` for completions, `chatcmpl-<id>` for chat. The answer's `id` is that name. The engine
# request (the one vLLM's span names) of a completion's prompt i is `cmpl-<id>-<i>`; a chat has one
# prompt and its engine request is `chatcmpl-<id>` itself.
_PREFIXES = ("chatcmpl-", "cmpl-")
_PROMPT_INDEX = re.compile(r"-(\d+)$")


def canonical_request_id(found: str) -> str:
    """The canonical id of a request named by the client's id or by vLLM's answer id.

    vLLM's endpoint prefix is taken off once (`cmpl-abc` and `chatcmpl-abc` are `abc`, the id the
    client sent or vLLM made up); an id without one is the client's own and is kept as it is.
    """
    for prefix in _PREFIXES:
        if found.startswith(prefix) and len(found) > len(prefix):
            return found[len(prefix) :]
    return found


def canonical_engine_request_id(engine_id: str) -> str:
    """The canonical id of the request an engine request (vLLM's span `gen_ai.request.id`) served.

    `chatcmpl-<id>` is `<id>`; `cmpl-<id>-0` is `<id>` (the first or only prompt of a completion),
    and `cmpl-<id>-<i>` for i > 0 is `<id>#<i>`: prompt i of a call that sent several, which no
    other source records on its own (the gateway records such a call once, under `<id>`).
    """
    if engine_id.startswith("cmpl-") and (index := _PROMPT_INDEX.search(engine_id)):
        base = canonical_request_id(engine_id[: index.start()])
        return base if index.group(1) == "0" else f"{base}#{index.group(1)}"
    return canonical_request_id(engine_id)


_TEXT_LIMITS = (
    ("request_id", REQUEST_ID_MAX), ("server", SERVER_MAX), ("trace_id", TRACE_ID_MAX),
    ("model", MODEL_MAX), ("tenant", TENANT_MAX), ("template", TEMPLATE_MAX),
    ("template_version", TEMPLATE_VERSION_MAX), ("cache_salt", SALT_MAX),
    ("prompt_cache_key", SALT_MAX),
)  # fmt: skip


def problem(facts: RequestFacts) -> Rejection | None:
    """Why `facts` cannot be stored: its code, and a detail led by the field at fault; None when
    they can."""
    if not facts.request_id:
        return Rejection(RejectReason.FIELD_INVALID, "request_id: empty")
    for name, limit in _TEXT_LIMITS:
        value = getattr(facts, name)
        if not value or (len(value) <= limit and value.isascii() and "\x00" not in value):
            continue  # the usual value, told apart here: a call per field cost more
        if fault := _text_fault(value, limit):
            return Rejection(fault[0], f"{name}: {fault[1]}")
    if facts.arrived_at.tzinfo is None:
        return Rejection(RejectReason.NO_TIME_ZONE, "arrived_at: no time zone")
    prompt, cached = facts.prompt_tokens, facts.cached_tokens
    if prompt is not None and cached is not None and cached > prompt:
        return Rejection(RejectReason.CACHED_OVER_PROMPT, "cached_tokens: more than prompt_tokens")
    return _hosted_problem(facts)


def _hosted_problem(facts: RequestFacts) -> Rejection | None:
    if facts.provider and facts.provider not in HOSTED_PROVIDERS:
        return Rejection(RejectReason.FIELD_INVALID, f"provider: not one of {', '.join(HOSTED_PROVIDERS)}")
    prompt, cached, written = facts.prompt_tokens, facts.cached_tokens, facts.cache_write_tokens
    if prompt is not None and written is not None and (cached or 0) + written > prompt:
        return Rejection(
            RejectReason.CACHED_OVER_PROMPT, "cache_write_tokens: with cached_tokens, more than prompt_tokens"
        )
    blocks = facts.prompt_blocks or ()
    if len(blocks) > PROMPT_BLOCKS_MAX:
        return Rejection(RejectReason.FIELD_INVALID, f"prompt_blocks: more than {PROMPT_BLOCKS_MAX}")
    if any(not digest or len(digest) > DIGEST_MAX or not digest.isascii() for digest in blocks):
        detail = f"prompt_blocks: a digest is empty, not ASCII or longer than {DIGEST_MAX} characters"
        return Rejection(RejectReason.FIELD_INVALID, detail)
    if any(not 0 <= index < len(blocks) for index in facts.cache_breakpoints or ()):
        return Rejection(RejectReason.FIELD_INVALID, "cache_breakpoints: an index outside prompt_blocks")
    return None


def _text_fault(value: str, limit: int) -> tuple[RejectReason, str] | None:
    if len(value) > limit:
        return RejectReason.TEXT_TOO_LONG, f"longer than {limit} characters"
    if "\x00" in value:
        return RejectReason.TEXT_INVALID, "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return RejectReason.TEXT_INVALID, "not valid Unicode (a lone surrogate)"
    return None
