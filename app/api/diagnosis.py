"""Why requests missed: each request's diagnosis; lost tokens by cause, group and minute; routing
effectiveness; the tenants' salt audit."""

from datetime import datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlencode

from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from ninja import Field, Query, Router, Schema
from pydantic import field_serializer

from app.api.auth import READERS
from app.api.errors import ApiError, error
from app.api.hosted_shapes import (
    AnthropicCacheDiagnostics,
    OpenAIPromptCacheDiagnostics,
    anthropic_diagnostics,
    openai_diagnostics,
    outcome_of,
)
from app.api.schemas import Instant
from app.api.viewers import caller_viewer
from app.core.tenancy import Viewer
from app.diagnosis.cost import scope_cost
from app.diagnosis.reads import (
    LOSS_GROUPS,
    LossRow,
    RoutingGroup,
    losses,
    lost_tokens_by_cause,
    routing_effectiveness,
    unexpected_hits,
)
from app.diagnosis.tenants import tenant_audit
from app.domain.misses import Cause, Loss
from app.fleet.models import Server
from app.prompts.selectors import find_template
from app.traffic.models import FUNNEL_COLUMNS
from app.traffic.selectors import AddressedRequest, addressed_request

router = Router(tags=["diagnosis"], auth=READERS)


# Its fields are FUNNEL_COLUMNS, in order (tests/diagnosis/test_shape.py).
class Funnel(Schema):
    prompt_tokens: int
    seen_before_tokens: int = Field(description="leading tokens seen before under its salt, anywhere")
    resident_anywhere_tokens: int = Field(description="leading tokens on the compatible server holding most")
    resident_here_tokens: int = Field(description="leading tokens resident on its own server at arrival")
    reused_tokens: int = Field(description="cached tokens, as vLLM reported them")

    @classmethod
    def of(cls, steps: object) -> "Funnel":
        """Of a diagnosis or of their sums: anything with the FUNNEL_COLUMNS as attributes."""
        return cls(**{column: getattr(steps, column) for column in FUNNEL_COLUMNS})


def _absent(value: object) -> bool:
    """A field left out of the answer, as the stored loss leaves it out (Loss.to_json)."""
    return value is None


class LossOut(Schema):
    """A run of blocks lost to one cause, in prompt order; the fields that do not apply to its cause
    are left out."""

    cause: Cause
    first_token: int
    tokens: int
    server_id: int | None = Field(
        None,
        description="routed_elsewhere: the server holding it; evicted: where it lived",
        exclude_if=_absent,
    )
    server_tokens: int | None = Field(
        None, description="routed_elsewhere: the prompt's leading tokens that server held", exclude_if=_absent
    )
    stored_at: datetime | None = Field(
        None, description="evicted: when the block had been stored", exclude_if=_absent
    )
    removed_at: datetime | None = Field(None, description="evicted: when it was removed", exclude_if=_absent)

    # Moments as the diagnosis stored them (microseconds, +00:00), as answers always gave them; with
    # no return type, the schema still says date-time.
    @field_serializer("stored_at", "removed_at")
    def _as_stored(self, at: datetime | None):  # type: ignore[no-untyped-def]
        return at.isoformat() if at is not None else None

    @classmethod
    def of(cls, loss: Loss) -> "LossOut":
        return cls(
            cause=loss.cause,
            first_token=loss.first_token,
            tokens=loss.tokens,
            server_id=loss.server,
            server_tokens=loss.server_tokens,
            stored_at=loss.stored_at,
            removed_at=loss.removed_at,
        )


class OtherRequest(Schema):
    arrived_at: datetime
    url: str = Field(description="its record and diagnosis")


class SameId(Schema):
    count: int = Field(description="other requests the client sent under this id to this server")
    others: list[OtherRequest] = Field(description="the latest of them, newest first (20 at most)")


class ArrivalQuery(Schema):
    at: Instant | None = Field(
        None, description="which request of a reused id: its arrival, exactly as listed (default: the latest)"
    )


class Diagnosed(Schema):
    server: str
    request_id: str
    arrived_at: datetime
    template: str | None
    template_version: str | None
    tenant: str
    diagnosed: bool = Field(description="false until the diagnosis task has run (a minute after arrival)")
    cause: str | None = Field(
        description="the cause that lost the most reusable tokens; null when none was lost"
    )
    unknown: str | None = Field(description="why there is no diagnosis: no_prompt, no_cached_tokens, ...")
    diverged_at: int | None = Field(
        description="prompt_changed: the first token departing from its template's earlier prompts under its "
        "salt; it may lie in a block lost to another cause (a salted request's first block another salt "
        "had), the prompt_changed loss then starting at a later block"
    )
    changed_part: str | None = Field(
        None,
        description="prompt_changed: the request part that changed from the request it was compared with "
        "(system, tools, tool_choice, response_format, reasoning_effort, template_kwargs, history, "
        "messages, model, adapter), by the gateway's digests of both; null when not known",
    )
    part_detail: str | None = Field(
        None,
        description="tools: added, removed, edited, reordered or re-serialized; template_kwargs: the name",
    )
    compared_with: str | None = Field(None, description="the request id of the request it was compared with")
    prompt_cache_diagnostics: OpenAIPromptCacheDiagnostics = Field(
        description="the same answer in OpenAI's shape (Responses API, gpt-5.6+)"
    )
    anthropic_diagnostics: AnthropicCacheDiagnostics = Field(
        description="the same answer in Anthropic's shape"
    )
    unexpected_hit: bool
    funnel: Funnel | None
    lost_tokens: dict[str, int] = Field(description="by cause; causes that lost nothing left out")
    losses: list[LossOut] = Field(description="runs of blocks lost to one cause, in prompt order")
    same_id: SameId = Field(
        description="the other requests under this id on this server: a client that reuses an id sends "
        "different requests under it (records further apart than the ingest merges are different requests)"
    )


ONE_OF_A_REUSED_ID = (
    "One request: the latest of that id on that server, or the one that arrived at `at`. A client that "
    "reused the id sent others: `same_id` counts and links them."
)


@router.get(
    "/requests/{server}/{request_id}/diagnosis",
    response={200: Diagnosed, 404: ApiError},
    summary="Why a request missed",
    description=ONE_OF_A_REUSED_ID,
)
def request_diagnosis(request: HttpRequest, server: str, request_id: str, query: Query[ArrivalQuery]) -> Any:
    found = addressed_request(
        server_name=server, request_id=request_id, arrived_at=query.at, viewer=caller_viewer(request)
    )
    if found is None:
        return error(404, "no such request on that server")
    return diagnosed_answer(found)


def diagnosed_answer(found: AddressedRequest) -> Diagnosed:
    """The request addressed and its diagnosis, with the others under its id (the requests API
    extends it)."""
    record, diagnosis = found.request.record, found.request.diagnosis
    path = reverse("api:request_detail", args=[record.server.name, record.request_id])
    others = [
        OtherRequest(arrived_at=at, url=f"{path}?{urlencode({'at': at.isoformat()})}") for at in found.others
    ]
    outcome = outcome_of(record, diagnosis)
    return Diagnosed(
        server=record.server.name,
        request_id=record.request_id,
        arrived_at=record.arrived_at,
        template=record.template.name if record.template else None,
        template_version=record.template_version.commit_sha if record.template_version else None,
        tenant=record.tenant,
        diagnosed=diagnosis is not None,
        cause=(diagnosis.cause or None) if diagnosis else None,
        unknown=(diagnosis.unknown or None) if diagnosis else None,
        diverged_at=diagnosis.diverged_at if diagnosis else None,
        changed_part=(diagnosis.changed_part or None) if diagnosis else None,
        part_detail=(diagnosis.part_detail or None) if diagnosis else None,
        compared_with=(diagnosis.compared_with or None) if diagnosis else None,
        prompt_cache_diagnostics=openai_diagnostics(outcome),
        anthropic_diagnostics=anthropic_diagnostics(outcome),
        unexpected_hit=diagnosis.unexpected_hit if diagnosis else False,
        funnel=Funnel.of(diagnosis) if diagnosis else None,
        lost_tokens=found.request.lost_tokens(),
        losses=[LossOut.of(loss) for loss in diagnosis.loss_runs] if diagnosis else [],
        same_id=SameId(count=found.other_count, others=others),
    )


class CauseWindow(Schema):
    since: Instant | None = Field(None, description="default: an hour before `until`")
    until: Instant | None = Field(None, description="default: now")


class CauseQuery(CauseWindow):
    scope: Literal["fleet", "server", "template", "tenant"] = "fleet"
    id: str = Field("", description="server: its name; template: its name or id; tenant: its name")


@router.get(
    "/miss-causes",
    response={200: dict[str, int], 404: ApiError},
    summary="Prompt tokens lost per cause",
    description="Over a window (default: the last hour), for the fleet, one server, template or tenant, "
    "from the per-minute rollups of the diagnoses (a minute counts when it starts in the window).",
)
def miss_causes(request: HttpRequest, query: Query[CauseQuery]) -> Any:
    until = query.until or timezone.now()
    since = query.since or until - timedelta(hours=1)
    viewer = caller_viewer(request)
    scope = _scope_of(query, viewer)
    if scope is None:
        return error(404, f"no {query.scope} named {query.id!r}")
    return lost_tokens_by_cause(since=since, until=until, viewer=viewer, **scope)


def _scope_of(query: CauseQuery, viewer: Viewer) -> dict[str, Any] | None:
    """The selectors' filter for the scope asked; None when the viewer sees no scope of that name."""
    scope: dict[str, Any] = {}
    if query.scope == "server":
        scope["server_id"] = (
            viewer.servers(Server.objects.all()).filter(name=query.id).values_list("pk", flat=True).first()
        )
    elif query.scope == "template":
        template = find_template(query.id, viewer=viewer)
        scope["template_id"] = template.pk if template else None
    elif query.scope == "tenant":
        scope["tenant"] = query.id
    return None if None in scope.values() else scope


class CostOut(Schema):
    since: datetime
    until: datetime
    counts: str = Field(description="What the lost tokens count")
    lost_tokens: int = Field(description="Counted in the window")
    tokens_per_hour: float = Field(description="lost_tokens over the window's length, idle minutes included")
    prefill_tokens_per_second: float
    rate_source: str = Field(description="measured (the scope's TTFT over uncached tokens) or configured")
    gpu_seconds_per_hour: float
    money_per_hour: float
    gpu_hour_price: float = Field(description="PREFIXSCOPE_GPU_HOUR_PRICE")


@router.get(
    "/cost",
    response={200: CostOut, 400: ApiError, 404: ApiError},
    summary="What a scope's lost reuse cost over a window",
    description="The product's one cost model (a regression's cost is its scope's over the window since "
    "its change, the last hour at most): the prompt tokens lost to misses a cache could have served "
    "(a template's: all causes but cold and shorter than one block; other scopes' also but a prompt "
    "changing) per hour of the window (default: the last hour), prefilled at the rate measured on the "
    "scope's requests of the window, in GPU-seconds and money. From the per-minute rollups (a minute "
    "counts when it starts in the window).",
)
def scope_cost_of(request: HttpRequest, query: Query[CauseQuery]) -> Any:
    until = query.until or timezone.now()
    since = query.since or until - timedelta(hours=1)
    if since >= until:
        return error(400, "since must come before until")
    viewer = caller_viewer(request)
    scope = _scope_of(query, viewer)
    if scope is None:
        return error(404, f"no {query.scope} named {query.id!r}")
    return scope_cost(since=since, until=until, viewer=viewer, **scope)


class LossQuery(CauseWindow):
    by: Literal["server", "template", "template_version", "tenant"] = "template"
    per_minute: bool = Field(False, description="one row per group and minute, in time order")


class LossGroup(Schema):
    group: dict[str, str | None] = Field(description="the group's names, e.g. {template, template_version}")
    minute: datetime | None = Field(description="per_minute only")
    requests: int
    unexpected_hits: int
    funnel: Funnel = Field(description="prompt, seen before, resident anywhere, resident here, reused")
    lost_tokens: dict[str, int] = Field(description="by cause; causes that lost nothing left out")


@router.get(
    "/losses",
    response=list[LossGroup],
    summary="Lost tokens by cause, per server, template, version or tenant",
    description="From per-minute rollups of the diagnoses: the groups that lost most first, or per minute.",
)
def loss_groups(request: HttpRequest, query: Query[LossQuery]) -> list[LossGroup]:
    until = query.until or timezone.now()
    since = query.since or until - timedelta(hours=1)
    found = losses(
        since=since, until=until, by=query.by, per_minute=query.per_minute, viewer=caller_viewer(request)
    )
    return [_loss_group(row, LOSS_GROUPS[query.by]) for row in found]


def _loss_group(row: LossRow, names: tuple[str, ...]) -> LossGroup:
    return LossGroup(
        group={name.split("__")[0]: value for name, value in zip(names, row.group, strict=True)},
        minute=row.minute,
        requests=row.requests,
        unexpected_hits=row.unexpected_hits,
        funnel=Funnel(**row.funnel),
        lost_tokens=row.lost,
    )


class Routing(Schema):
    model: str
    block_size: int | None
    hash_algo: str
    servers: list[str]
    requests: int
    resident_anywhere_tokens: int
    reused_tokens: int
    routed_elsewhere_tokens: int = Field(description="tokens resident on another server of the group")
    effectiveness: float | None = Field(description="reused / resident anywhere")


@router.get(
    "/routing",
    response=list[Routing],
    summary="Routing effectiveness per group of compatible servers",
)
def routing(request: HttpRequest, window: Query[CauseWindow]) -> list[RoutingGroup]:
    until = window.until or timezone.now()
    since = window.since or until - timedelta(hours=1)
    return routing_effectiveness(since=since, until=until, viewer=caller_viewer(request))


class Tenant(Schema):
    tenant: str
    requests: int
    prompt_tokens: int
    reused_tokens: int
    salt_tokens: int = Field(
        description="tokens resident under another salt: isolation working, and its cost"
    )
    unexpected_hits: int = Field(description="requests that reused more than their own salt had resident")


class UnexpectedHit(Schema):
    server: str
    request_id: str
    arrived_at: datetime
    tenant: str
    template: str | None
    reused_tokens: int
    prompt_tokens: int


class Audit(Schema):
    tenants: list[Tenant]
    unexpected_hits: list[UnexpectedHit] = Field(description="the latest 50, newest first")


@router.get("/tenants/audit", response=Audit, summary="Salt isolation per tenant, and unexpected hits")
def tenants_audit(request: HttpRequest, window: Query[CauseWindow]) -> dict[str, Any]:
    until = window.until or timezone.now()
    since, viewer = window.since or until - timedelta(hours=1), caller_viewer(request)
    hits = [
        {
            "server": hit.server.name,
            "request_id": hit.request_id,
            "arrived_at": hit.arrived_at,
            "tenant": hit.tenant,
            "template": hit.template.name if hit.template else None,
            "reused_tokens": hit.reused_tokens,
            "prompt_tokens": hit.prompt_tokens,
        }
        for hit in unexpected_hits(since=since, viewer=viewer)
    ]
    return {"tenants": tenant_audit(since=since, until=until, viewer=viewer), "unexpected_hits": hits}
