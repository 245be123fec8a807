"""What the REST API takes (msgspec for the bulk-ingest body) and gives (pydantic, through django-ninja)."""

from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from msgspec import Meta
from ninja import Field, Schema
from pydantic import AfterValidator

from collectors import records

INTEGER_MAX = 2**31 - 1  # PostgreSQL's integer, the columns of counts and token ids
Text = Annotated[str, Meta(max_length=records.MODEL_MAX)]
Seconds = Annotated[float, Meta(ge=0)] | None
Count = Annotated[int, Meta(ge=0, le=INTEGER_MAX)] | None
TokenId = Annotated[int, Meta(ge=-INTEGER_MAX - 1, le=INTEGER_MAX)]


def in_utc(value: datetime) -> datetime:
    """The time in UTC; one without a time zone is taken as UTC. PostgreSQL refuses an offset beyond
    15:59 (Python takes up to 23:59), and a time near year 1 or 9999 may have no UTC equivalent: a
    ValueError, which the API answers 400."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time is out of range once in UTC") from None


Instant = Annotated[datetime, AfterValidator(in_utc)]
"""A time an API operation takes (ISO 8601; without a time zone: UTC), read as UTC."""


class RequestRecordIn(msgspec.Struct, kw_only=True):
    """One inference request. Token counts may come as fields or as the provider's `usage` object."""

    # A msgspec Struct, not a pydantic model: batches carry thousands of these, and msgspec
    # decodes and validates a whole body in one pass, several times faster than json + pydantic.

    server: Annotated[
        str,
        Meta(
            min_length=1, max_length=records.SERVER_MAX, description="A registered server's name or base URL"
        ),
    ]
    request_id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=records.REQUEST_ID_MAX,
            description=(
                "The client's X-Request-Id, or vLLM's answer id (`cmpl-<id>`, `chatcmpl-<id>`, which is "
                "taken as `<id>`): records of one server and id from any source merge into one"
            ),
        ),
    ]
    arrived_at: Annotated[
        datetime,
        Meta(
            tz=True,
            description="ISO 8601 with a time zone, or Unix seconds",
            extra_json_schema={"format": "date-time"},
        ),
    ]
    trace_id: Annotated[str, Meta(max_length=records.TRACE_ID_MAX)] = ""
    model: Text = ""
    tenant: Annotated[str, Meta(max_length=records.TENANT_MAX)] = ""
    template: Annotated[str, Meta(max_length=records.TEMPLATE_MAX, description="Prompt template name")] = ""
    template_version: Annotated[
        str, Meta(max_length=records.TEMPLATE_VERSION_MAX, description="The template repository's commit sha")
    ] = ""
    client_ttft_seconds: Annotated[float, Meta(ge=0, description="TTFT as the client saw it")] | None = None
    server_ttft_seconds: Annotated[float, Meta(ge=0, description="TTFT as vLLM measured it")] | None = None
    ttft_seconds: (
        Annotated[float, Meta(ge=0, description="Deprecated: read as client_ttft_seconds")] | None
    ) = None
    queue_seconds: Seconds = None
    prefill_seconds: Seconds = None
    prompt_tokens: Count = None
    cached_tokens: Count = None
    completion_tokens: Count = None
    usage: Annotated[dict[str, Any], Meta(description="OpenAI/vLLM or Anthropic usage object")] | None = None
    cache_salt: (
        Annotated[str, Meta(max_length=records.SALT_MAX, description="Hashed on arrival, never stored")]
        | None
    ) = None
    prompt_token_ids: (
        Annotated[list[TokenId], Meta(description="Kept under the token retention setting")] | None
    ) = None
    # Hosted APIs (app/domain/hosted.py): the provider's documented cache rules apply to them.
    provider: Annotated[
        str, Meta(max_length=20, description=f"Hosted API: one of {', '.join(records.HOSTED_PROVIDERS)}")
    ] = ""
    cache_write_tokens: Count = None
    cache_ttl: (
        Annotated[
            str,
            Meta(
                max_length=8,
                description='The TTL the cache writes used, "5m" or "1h" '
                "(Anthropic's cache_control.ttl); usage's cache_creation or cacheDetails say it too",
            ),
        ]
        | None
    ) = None
    prompt_cache_key: (
        Annotated[str, Meta(max_length=records.SALT_MAX, description="Hashed on arrival, never stored")]
        | None
    ) = None
    prompt_blocks: (
        Annotated[
            list[str],
            Meta(
                description="A digest of each content block of the prompt, in order (never its text); "
                "a hosted API's record without them gets them from its request_body"
            ),
        ]
        | None
    ) = None
    cache_breakpoints: (
        Annotated[list[int], Meta(description="Indexes in prompt_blocks of the blocks with a cache marker")]
        | None
    ) = None
    request_body: (
        Annotated[
            dict[str, Any],
            Meta(
                description=(
                    "The body the request sent: an OpenAI chat-completions body (messages, tools, "
                    "tool_choice, response_format, reasoning_effort, chat_template_kwargs) or an Anthropic "
                    "Messages body (system, tools, messages, thinking). Digested on arrival with the "
                    "deployment's key, part by part, so a prompt change can name the part that changed; "
                    "never stored; a hosted API's record without prompt_blocks gets them (and its "
                    "cache_control markers as cache_breakpoints) from it. A body of neither shape rejects "
                    "the record (parts_invalid)"
                )
            ),
        ]
        | None
    ) = None
    semantic_cache_hit: (
        Annotated[bool, Meta(description="Answered by a gateway's response cache: never prefix reuse")] | None
    ) = None
    response_headers: (
        Annotated[
            dict[str, str], Meta(description="The answer's headers; only cache-status headers are read")
        ]
        | None
    ) = None


def request_record_json_schema() -> dict[str, Any]:
    """The JSON schema of one record, for the OpenAPI document (it has no nested definitions)."""
    definitions: dict[str, dict[str, Any]] = msgspec.json.schema(RequestRecordIn)["$defs"]
    return definitions["RequestRecordIn"]


class Rejection(Schema):
    index: int = Field(description="Position of the record in the batch")
    error: str = Field(description="The field and what is wrong with it")


class IngestAnswer(Schema):
    stored: int
    rejected: list[Rejection]
