"""A request's page: why its prompt tokens were not reused (its losses, where its prompt departs, its
block chain), its template's cache killers under its salt, the earlier request Compare pairs it with,
its prompt for a viewer who may read it, and the other requests a client sent under its id."""

from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from app.compare.killers import visible_killers
from app.compare.selectors import RecordKey, previous_request_key
from app.compare.tokenization import Detokenizer
from app.core.http import HtmxHttpRequest
from app.core.tenancy import SEES_ALL, Viewer, viewer_of
from app.dashboard.killer_rows import KillerRow, killer_rows
from app.diagnosis.shown import Departure, ShownLoss, departure, loss_at, shown_losses
from app.domain.misses import Cause, Loss, cause_label
from app.fleet.models import Server
from app.prompts.killers import killer_at, may_read_prompts, template_killers
from app.prompts.models import CacheKiller
from app.traffic.explorer import kept_token_ids
from app.traffic.models import FUNNEL_COLUMNS, RequestDiagnosis, RequestRecord
from app.traffic.selectors import DiagnosedRequest, addressed_request


@login_required
def request_detail(request: HtmxHttpRequest, server: str, request_id: str) -> HttpResponse:
    """One request (the latest of its id on its server, or the one arrived at `?at=`) with why its
    prompt tokens were not reused, the cache killers of its template under its salt, marking the one
    its divergence is at, and links to the other requests a client sent under the same id."""
    viewer = viewer_of(request.user)
    found = addressed_request(
        server_name=server, request_id=request_id, arrived_at=_arrival(request.GET.get("at")), viewer=viewer
    )
    if found is None:
        raise Http404("no such request")
    names = dict(viewer.servers(Server.objects.all()).values_list("pk", "name"))
    item = shown_request(found.request, user=request.user, names=names, now=timezone.now(), viewer=viewer)
    others = [(at, request_page_url(server, request_id, at)) for at in found.others]
    context = {
        "server": server,
        "request_id": request_id,
        "found": [item],
        "others": others,
        "other_count": found.other_count,
    }
    return render(request, "dashboard/request.html", context)


def _arrival(text: str | None) -> datetime | None:
    """`?at=`: an ISO 8601 arrival (UTC without a zone); a value that is not one names no request."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise Http404("no such request") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


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
    heard = not diagnosis.no_kv_events_tokens
    losses = diagnosis.loss_runs
    rows = []
    for index in range(diagnosis.prompt_tokens // size):
        first, end = index * size, (index + 1) * size
        loss = loss_at(losses, first)
        hashes = record.block_hashes
        rows.append(
            BlockRow(
                index=index, first_token=first, last_token=end - 1,
                hash_hex=f"{hashes[index] % 2**64:016x}" if index < len(hashes) else "",
                seen_before=end <= diagnosis.seen_before_tokens,
                resident_anywhere=end <= diagnosis.resident_anywhere_tokens,
                resident_here=end <= diagnosis.resident_here_tokens if heard else None,
                reused=end <= diagnosis.reused_tokens,
                lost_to=cause_label(loss.cause) if loss else "",
                detail=_loss_detail(loss, names) if loss else "",
                token_ids=token_ids[first:end] if token_ids is not None else None,
            )
        )  # fmt: skip
    return rows


def _loss_detail(loss: Loss, names: dict[int, str]) -> str:
    where = names.get(loss.server, "another server") if loss.server is not None else "another server"
    if loss.cause == Cause.ROUTED_ELSEWHERE:
        return f"resident on {where}"
    if loss.cause == Cause.EVICTED and loss.removed_at is not None:
        return f"removed from {where} at {loss.removed_at:%H:%M:%S}"
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


@dataclass(frozen=True, slots=True)
class RequestShown:
    """What the request page shows of one arrival: its record and diagnosis, worded; the cache
    killers of its template under its salt (`at_killer` the one its prompt departs at); its key for
    Compare and the earlier request Compare pairs it with; its block chain; its prompt for a viewer
    who may read it."""

    record: RequestRecord
    diagnosis: RequestDiagnosis | None
    losses: list[ShownLoss]
    departure: Departure | None
    funnel: list[tuple[str, int]]  # each step's label and leading tokens; [] when not diagnosed
    killers: list[KillerRow]
    at_killer: CacheKiller | None
    key: str
    previous: RecordKey | None
    previous_url: str | None
    chain: list[BlockRow]
    prompt: PromptShown | None


# The funnel's steps as the page names them, in FUNNEL_COLUMNS' order.
_FUNNEL_STEPS = dict(
    zip(
        FUNNEL_COLUMNS,
        (
            "Prompt",
            "Seen before under its salt (unlimited cache, ideal routing)",
            "Resident anywhere in the fleet at arrival",
            "Resident on its server at arrival",
            "Reused (vLLM's cached tokens)",
        ),
        strict=True,
    )
)


def shown_request(
    found: DiagnosedRequest,
    *,
    user: AbstractBaseUser | AnonymousUser,
    names: dict[int, str],
    now: datetime,
    viewer: Viewer = SEES_ALL,
) -> RequestShown:
    """One arrival as the request page shows it (`names`: server id -> name, of those the viewer sees)."""
    record, diagnosis = found.record, found.diagnosis
    key = RecordKey.of(record)
    ids = kept_token_ids(record, now=now) if may_read_prompts(user) else None
    previous = previous_request_key(key, viewer=viewer)
    killers, here = _killers(found, names=names, viewer=viewer)
    return RequestShown(
        record=record,
        diagnosis=diagnosis,
        losses=shown_losses(diagnosis, names=names),
        departure=departure(
            diagnosis, block_size=record.server.block_size, starts=(record.part_digests or {}).get("starts")
        ),
        funnel=_funnel(diagnosis),
        killers=killers,
        at_killer=here,
        key=str(key),
        previous=previous,
        previous_url=(
            request_page_url(names.get(previous.server_id, "?"), previous.request_id, previous.arrived_at)
            if previous is not None
            else None
        ),
        chain=block_chain(record, diagnosis, names=names, token_ids=ids),
        prompt=_decoded(record, ids) if ids is not None else None,
    )


def _funnel(diagnosis: RequestDiagnosis | None) -> list[tuple[str, int]]:
    if diagnosis is None:
        return []
    return [(step, getattr(diagnosis, column)) for column, step in _FUNNEL_STEPS.items()]


def _killers(
    found: DiagnosedRequest, *, names: dict[int, str], viewer: Viewer
) -> tuple[list[KillerRow], CacheKiller | None]:
    """The cache killers of its template under its salt, and the one its prompt departs at."""
    record = found.record
    killers = list(template_killers(record.template_id)) if record.template_id is not None else []
    killers, seen = visible_killers(killers, viewer=viewer)
    salted = [k for k in killers if k.salt_hash == record.salt_hash]
    diverged_at = found.diagnosis.diverged_at if found.diagnosis else None
    here = killer_at(salted, salt_hash=record.salt_hash, diverged_at=diverged_at)
    return killer_rows(salted, names, {}, here=here, seen=seen), here


def _decoded(record: RequestRecord, token_ids: list[int]) -> PromptShown:
    with Detokenizer(server=record.server, model=record.model) as decode:
        text = decode(token_ids)
        return PromptShown(text, decode.used, len(token_ids))
