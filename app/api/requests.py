"""Request records for scripts: the explorer's filters and keyset pages, and one request's record with
its diagnosis. No prompt content unless the caller may read prompts and retention keeps it."""

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from ninja import Field, Query, Router, Schema

from app.api.auth import READERS
from app.api.diagnosis import ONE_OF_A_REUSED_ID, ArrivalQuery, Diagnosed, diagnosed_answer
from app.api.errors import ApiError, error
from app.api.ingest.rest import router as ingest_router
from app.api.viewers import caller_viewer
from app.compare.selectors import RecordKey, previous_request_key
from app.domain.keyset import BadCursor
from app.domain.misses import OF_REQUEST
from app.prompts.killers import may_read_prompts
from app.traffic.explorer import (
    MAX_PAGE_SIZE,
    PAGE_SIZE,
    ExploredRequest,
    RequestFilterForm,
    encoded,
    explore_requests,
    kept_token_ids,
)
from app.traffic.selectors import addressed_request

router = Router(tags=["requests"], auth=READERS)


class RequestListQuery(Schema):
    # Text, checked by the explorer's form as the page checks it: a bad value is a 400 with a code.
    server: str | None = Field(None, description="a server's name")
    template: str | None = Field(None, description="a template's name")
    version: str | None = Field(
        None, description="a template version: its commit sha or 4+ leading hex digits"
    )
    tenant: str | None = None
    cause: str | None = Field(None, description="the diagnosis' main cause, e.g. prompt_changed, evicted")
    window: str | None = Field(None, description="15m, 1h, 6h, 24h (default) or 7d, ending at `until`")
    until: str | None = Field(None, description="the window's end, ISO 8601 (default: now)")
    hit_min: str | None = Field(None, description="lowest cached share of prompt tokens, percent")
    hit_max: str | None = Field(None, description="highest cached share of prompt tokens, percent")
    missed: str | None = Field(None, description="true: only requests that lost reusable tokens")
    cursor: str | None = Field(None, description="the `cursor` of the previous page; opaque")
    limit: str | None = Field(None, description=f"rows per page, 1 to {MAX_PAGE_SIZE} (default {PAGE_SIZE})")


class RequestRow(Schema):
    server: str
    request_id: str
    arrived_at: datetime
    template: str | None
    template_version: str | None
    tenant: str
    prompt_tokens: int | None
    cached_tokens: int | None
    hit_rate: float | None = Field(description=f"{OF_REQUEST}; null when either is unknown")
    cause: str | None = Field(description="the diagnosis' main cause; null when none was lost or undiagnosed")
    diagnosed: bool
    client_ttft_seconds: float | None = Field(description="time to first token as the client saw it")
    server_ttft_seconds: float | None = Field(description="time to first token as vLLM measured it")
    url: str = Field(description="this request's record and diagnosis")


class RequestList(Schema):
    items: list[RequestRow] = Field(description="newest first")
    hit_rate_definition: str = Field(OF_REQUEST, description="what each item's hit_rate is the share of")
    cursor: str | None = Field(description="pass as `cursor` (with the same filters) for the next page")
    next: str | None = Field(
        description="the next page's URL, its window's end pinned; null on the last page"
    )


# On the bulk ingest's router: django-ninja routes a path to the first router declaring it, so a GET
# declared here on a router of its own would meet the ingest's POST-only view (a 405).
@ingest_router.get(
    "/requests",
    auth=READERS,
    tags=["requests"],
    response={200: RequestList, 400: ApiError},
    summary="List requests",
    description=(
        "Request records matching every filter given, newest first, one keyset page at a time: follow "
        "`next` (or pass `cursor` with the same filters; under others it is refused). No prompt content."
    ),
)
def list_requests(request: HttpRequest, query: Query[RequestListQuery]) -> Any:
    params = {name: str(value) for name, value in query.dict().items() if value not in (None, "")}
    limit = _limit(params.pop("limit", None))
    form = RequestFilterForm(params, viewer=caller_viewer(request))
    if limit is None or not form.is_valid():
        fields = {} if limit is not None else {"limit": [f"a whole number from 1 to {MAX_PAGE_SIZE}"]}
        fields |= {name: [str(e) for e in errors] for name, errors in form.errors.items()}
        return error(400, "some parameters cannot be read", code="bad_filter", fields=fields)
    filters = form.filters(now=timezone.now())
    try:
        after = form.after(filters)
    except BadCursor as exc:
        return error(400, str(exc), code="bad_cursor", fields={"cursor": [str(exc)]})
    page = explore_requests(filters, after=after, limit=limit)
    token = encoded(page.next, form, filters)
    pinned = form.pinned(filters) | {"limit": str(limit)}
    next_url = (
        request.build_absolute_uri(f"{request.path}?{urlencode(pinned | {'cursor': token})}")
        if token
        else None
    )
    return {"items": [_row(row) for row in page.rows], "cursor": token, "next": next_url}


def _limit(text: str | None) -> int | None:
    if text is None:
        return PAGE_SIZE
    try:
        limit = int(text)
    except ValueError:
        return None
    return limit if 1 <= limit <= MAX_PAGE_SIZE else None


def _row(row: ExploredRequest) -> dict[str, Any]:
    record, diagnosis = row.record, row.diagnosis
    return {
        "server": record.server.name, "request_id": record.request_id, "arrived_at": record.arrived_at,
        "template": record.template.name if record.template else None,
        "template_version": record.template_version.commit_sha if record.template_version else None,
        "tenant": record.tenant, "prompt_tokens": record.prompt_tokens, "cached_tokens": record.cached_tokens,
        "hit_rate": None if row.hit_percent is None else row.hit_percent / 100,
        "cause": (diagnosis.cause or None) if diagnosis else None, "diagnosed": diagnosis is not None,
        "client_ttft_seconds": record.client_ttft_seconds, "server_ttft_seconds": record.server_ttft_seconds,
        "url": _detail_url(record.server.name, record.request_id, record.arrived_at),
    }  # fmt: skip


def _detail_url(server: str, request_id: str, arrived_at: datetime) -> str:
    """The request's own URL: its arrival picks it out of the others of a reused id."""
    path = reverse("api:request_detail", args=[server, request_id])
    return f"{path}?{urlencode({'at': arrived_at.isoformat()})}"


class RequestKey(Schema):
    server: str
    request_id: str
    arrived_at: datetime


class RequestDetail(Diagnosed):
    model: str
    source: str
    trace_id: str
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    client_ttft_seconds: float | None = Field(description="time to first token as the client saw it")
    server_ttft_seconds: float | None = Field(description="time to first token as vLLM measured it")
    queue_seconds: float | None
    prefill_seconds: float | None
    salted: bool = Field(description="sent with a cache salt (stored hashed, never shown)")
    block_hashes: list[str] = Field(description="the prompt's block-hash chain, 16 hex digits each")
    previous: RequestKey | None = Field(
        description="the earlier request on its server under its salt and model sharing the most leading "
        "blocks (the latest of those): side a's `request` in POST /api/v1/compare, or send `previous: true`"
    )
    token_ids: list[int] | None = Field(
        description="prompt token ids: only for users who may read prompts, while retention keeps them"
    )


@router.get(
    "/requests/{server}/{request_id}",
    response={200: RequestDetail, 404: ApiError},
    summary="A request's record and diagnosis",
    description=ONE_OF_A_REUSED_ID,
)
def request_detail(request: HttpRequest, server: str, request_id: str, query: Query[ArrivalQuery]) -> Any:
    viewer = caller_viewer(request)
    found = addressed_request(server_name=server, request_id=request_id, arrived_at=query.at, viewer=viewer)
    if found is None:
        return error(404, "no such request on that server")
    record = found.request.record
    previous = previous_request_key(RecordKey.of(record), viewer=viewer)
    earlier = (
        None
        if previous is None
        else RequestKey(server=server, request_id=previous.request_id, arrived_at=previous.arrived_at)
    )
    readable = may_read_prompts(request.user)
    return RequestDetail(
        **dict(diagnosed_answer(found)),
        model=record.model,
        source=record.source,
        trace_id=record.trace_id,
        prompt_tokens=record.prompt_tokens,
        cached_tokens=record.cached_tokens,
        completion_tokens=record.completion_tokens,
        client_ttft_seconds=record.client_ttft_seconds,
        server_ttft_seconds=record.server_ttft_seconds,
        queue_seconds=record.queue_seconds,
        prefill_seconds=record.prefill_seconds,
        salted=bool(record.salt_hash),
        block_hashes=[f"{h % 2**64:016x}" for h in record.block_hashes],
        previous=earlier,
        token_ids=kept_token_ids(record, now=timezone.now()) if readable else None,
    )
