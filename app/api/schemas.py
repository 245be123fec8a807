"""What the REST API takes and gives (pydantic, through django-ninja)."""

from datetime import datetime
from typing import Any

from ninja import Field, Schema
from pydantic import BaseModel


class RequestRecordIn(BaseModel):
    """One inference request. Token counts may come as fields or as the provider's `usage` object.

    A plain pydantic model, not a ninja Schema: batches validate thousands of these, and
    Schema's attribute resolution (for ORM objects) costs several times more per record.
    """

    server: str = Field(min_length=1, max_length=500, description="A registered server's name or base URL")
    request_id: str = Field(min_length=1, max_length=255)
    arrived_at: datetime = Field(description="ISO 8601 with a time zone, or Unix seconds")
    trace_id: str = Field("", max_length=32)
    model: str = Field("", max_length=255)
    tenant: str = Field("", max_length=100)
    template: str = Field("", max_length=200, description="Prompt template name")
    template_version: str = Field("", max_length=40, description="The template repository's commit sha")
    ttft_seconds: float | None = Field(None, ge=0)
    queue_seconds: float | None = Field(None, ge=0)
    prefill_seconds: float | None = Field(None, ge=0)
    prompt_tokens: int | None = Field(None, ge=0)
    cached_tokens: int | None = Field(None, ge=0)
    completion_tokens: int | None = Field(None, ge=0)
    usage: dict[str, Any] | None = Field(None, description="OpenAI/vLLM or Anthropic usage object")
    cache_salt: str | None = Field(None, max_length=1024, description="Hashed on arrival, never stored")
    prompt_token_ids: list[int] | None = Field(None, description="Kept under the token retention setting")


class Rejection(Schema):
    index: int = Field(description="Position of the record in the batch")
    error: str = Field(description="The field and what is wrong with it")


class IngestAnswer(Schema):
    stored: int
    rejected: list[Rejection]


class ErrorAnswer(Schema):
    error: str
