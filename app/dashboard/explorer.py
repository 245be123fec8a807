"""The Requests explorer page: request records filtered and paged newest first (app/traffic/explorer.py).

One view serves the page and, for htmx, its #request-rows partial (the table and its next-page link).
Every view is a URL: the filters are the query string, and the next-page link pins the window's end.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from app.compare.selectors import RecordKey, previous_request_key
from app.compare.tokenization import Detokenizer
from app.core.http import HtmxHttpRequest
from app.core.tenancy import SEES_ALL, Viewer, viewer_of
from app.domain.keyset import BadCursor
from app.prompts.killers import may_read_prompts
from app.traffic.explorer import (
    RequestFilterForm,
    RequestFilters,
    RequestPage,
    encoded,
    explore_requests,
    kept_token_ids,
)
from app.traffic.models import RequestDiagnosis, RequestRecord
from app.traffic.selectors import DiagnosedRequest


@login_required
@require_GET
def requests_explorer(request: HtmxHttpRequest) -> HttpResponse:
    """The filter form and one page of matching requests; invalid filters or a cursor of other
    filters show the form with its errors and no rows (status 400)."""
    form = RequestFilterForm(request.GET, viewer=viewer_of(request.user))
    context: dict[str, object] = {"form": form, "page": None, "next_url": None, "first_url": None}
    if form.is_valid():
        filters = form.filters(now=timezone.now())
        try:
            after = form.after(filters)
        except BadCursor as exc:
            form.add_error("cursor", str(exc))
        else:
            page = explore_requests(filters, after=after)
            context |= _links(form, filters, page, paged=after is not None)
    if request.htmx:  # htmx swaps only 2xx answers: the errors replace the rows all the same
        return render(request, "dashboard/requests.html#request-rows", context)
    return render(request, "dashboard/requests.html", context, status=200 if form.is_valid() else 400)


def _links(
    form: RequestFilterForm, filters: RequestFilters, page: RequestPage, *, paged: bool
) -> dict[str, object]:
    base = reverse("dashboard:requests")
    pinned = form.pinned(filters)
    token = encoded(page.next, form, filters)
    return {
        "page": page,
        "since": filters.since,
        "until": filters.until,
        "next_url": f"{base}?{urlencode(pinned | {'cursor': token})}" if token else None,
        "first_url": f"{base}?{urlencode(pinned)}" if paged else None,
    }


# --- one request's page (views.request_detail): its block chain, Compare, its prompt ----------------


@dataclass(frozen=True, slots=True)
class BlockRow:
    """One full block of a request's prompt and what became of it."""

    index: int
    first_token: int
    last_token: int
    hash_hex: str  # "" when the chain was not recorded
    seen_before: bool
    resident_anywhere: bool
    resident_here: bool | None  # None: its server sends no KV events, so what it held is not known
    reused: bool
    lost_to: str  # the cause's label, "" when reused or not diagnosed
    detail: str
    token_ids: list[int] | None  # None unless the viewer may read prompts and retention keeps them


def block_chain(
    record: RequestRecord,
    diagnosis: RequestDiagnosis | None,
    *,
    names: dict[int, str],
    token_ids: list[int] | None,
) -> list[BlockRow]:
    """Block by block, the funnel of a diagnosed request: each full block (the tail below one block is
    never reused) was seen before, resident somewhere, resident on its server, reused, or lost to a
    cause. Empty when the server's block size or the diagnosis is unknown."""
    size = record.server.block_size
    if not size or diagnosis is None or diagnosis.unknown:
        return []
    labels = dict(RequestDiagnosis.Cause.choices)
    heard = not diagnosis.no_kv_events_tokens
    rows = []
    for index in range(diagnosis.prompt_tokens // size):
        first, end = index * size, (index + 1) * size
        loss = next(
            (lo for lo in diagnosis.losses if lo["first_token"] <= first < lo["first_token"] + lo["tokens"]),
            None,
        )
        hashes = record.block_hashes
        rows.append(
            BlockRow(
                index=index, first_token=first, last_token=end - 1,
                hash_hex=f"{hashes[index] % 2**64:016x}" if index < len(hashes) else "",
                seen_before=end <= diagnosis.seen_before_tokens,
                resident_anywhere=end <= diagnosis.resident_anywhere_tokens,
                resident_here=end <= diagnosis.resident_here_tokens if heard else None,
                reused=end <= diagnosis.reused_tokens,
                lost_to=labels.get(loss["cause"], loss["cause"]) if loss else "",
                detail=_loss_detail(loss, names) if loss else "",
                token_ids=token_ids[first:end] if token_ids is not None else None,
            )
        )  # fmt: skip
    return rows


def _loss_at(losses: list[dict[str, Any]], token: int) -> dict[str, Any] | None:
    """The run of lost blocks holding this token, if any."""
    return next((loss for loss in losses if 0 <= token - loss["first_token"] < loss["tokens"]), None)


def _loss_detail(loss: dict[str, Any], names: dict[int, str]) -> str:
    where = names.get(loss.get("server_id", 0), "another server")
    if loss["cause"] == "routed_elsewhere":
        return f"resident on {where}"
    if loss["cause"] == "evicted" and "removed_at" in loss:
        return f"removed from {where} at {loss['removed_at'][11:19]}"
    return ""


@dataclass(frozen=True, slots=True)
class PromptShown:
    """A request's prompt for a viewer who may read prompts, while retention keeps its token ids."""

    text: str
    decoded_by: str
    token_count: int


def request_page_url(server: str, request_id: str, arrived_at: datetime | None = None) -> str:
    """The request page of that server and id: of the request arrived at `arrived_at` when given
    (a client may reuse an id), else of the latest."""
    path = reverse("dashboard:request-detail", args=[server, request_id])
    return path if arrived_at is None else f"{path}?{urlencode({'at': arrived_at.isoformat()})}"


def request_extras(
    found: DiagnosedRequest,
    *,
    user: AbstractBaseUser | AnonymousUser,
    names: dict[int, str],
    now: datetime,
    viewer: Viewer = SEES_ALL,
) -> dict[str, object]:
    """What the request page shows of one arrival beside its diagnosis: its key for Compare, the
    earlier request Compare pairs it with, its block chain, and its prompt for a viewer who may."""
    record = found.record
    key = RecordKey.of(record)
    ids = kept_token_ids(record, now=now) if may_read_prompts(user) else None
    previous = previous_request_key(key, viewer=viewer)
    previous_url = (
        request_page_url(names.get(previous.server_id, "?"), previous.request_id, previous.arrived_at)
        if previous is not None
        else None
    )
    return {
        "key": str(key),
        "previous": previous,
        "previous_url": previous_url,
        "chain": block_chain(record, found.diagnosis, names=names, token_ids=ids),
        "prompt": _decoded(record, ids) if ids is not None else None,
    }


def _decoded(record: RequestRecord, token_ids: list[int]) -> PromptShown:
    with Detokenizer(server=record.server, model=record.model) as decode:
        text = decode(token_ids)
        return PromptShown(text, decode.used, len(token_ids))
