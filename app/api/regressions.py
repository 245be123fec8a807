"""Regressions: drops of a scope's delivered hit rate or rises of its TTFT p90, what each is attributed
to, and its cost
(app/regressions). Read by a logged-in user's session or personal API token; a note (acknowledge, mute)
is a person's too (a session sends X-CSRFToken), never an ingest token's."""

from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from ninja import Field, Query, Router, Schema
from ninja.pagination import paginate

from app.api.auth import PEOPLE, READ_AUTH, READERS
from app.api.errors import ApiError, error
from app.api.pages import Pages
from app.api.templates import KillerOut, killer_out
from app.api.viewers import caller_viewer
from app.compare.killers import visible_killers
from app.domain.cost import COUNTS
from app.fleet.models import Server
from app.regressions import evidence, selectors, services
from app.regressions.cost import cost_window_of
from app.regressions.models import Regression

router = Router(tags=["regressions"])

StateFilter = Literal["active", "all", "open", "acknowledged", "muted", "resolved"]
Scope = Literal["template", "template_server", "template_tenant", "server", "tenant", "fleet"]
Metric = Literal["hit_rate", "ttft"]
Kind = Literal["template_commit", "capacity", "routing", "salt_rotation", "restart", "unknown"]


class RegressionFilters(Schema):
    state: StateFilter = Field("active", description="active: not resolved")
    scope: Scope | None = None
    metric: Metric | None = None
    kind: Kind | None = None


class CandidateOut(Schema):
    version_id: int
    commit_sha: str
    message: str
    gain: float = Field(description="Its share of the template's requests after the change less before")
    live_at: datetime | None = Field(
        description="Its latest deploy marker up to the change, else its first request"
    )
    minutes_before_change: float | None


class CostOut(Schema):
    since: datetime = Field(description="The window priced: from its change, the last hour at most")
    until: datetime = Field(description="The last whole minute summed when it was last updated")
    counts: str = Field(description="What the lost tokens count")
    scope_lost_tokens_per_hour: float = Field(
        description="Lost since the change: all the prompt tokens its scope lost in the window (as counted) "
        "over the window's length, idle minutes included: GET /api/v1/cost's tokens_per_hour and the "
        "template page's figure for the same scope and window"
    )
    lost_tokens_per_hour: float = Field(
        description="The headline: of scope_lost_tokens_per_hour, those over what the scope lost at its "
        "rate before ((rate_before - the window's rate) x its prompt tokens, per hour of the window): "
        "what reverting or fixing the change wins back"
    )
    prefill_tokens_per_second: float
    prefill_rate_source: str = Field(description="measured (from the records) or configured")
    gpu_seconds_per_hour: float = Field(description="Of lost_tokens_per_hour, at the prefill rate")
    cost_per_hour: float = Field(
        description="Of lost_tokens_per_hour, at PREFIXSCOPE_GPU_HOUR_PRICE a GPU-hour"
    )


class FrozenKillerOut(KillerOut):
    found_at: datetime = Field(description="The killer search that first found it with the regression")


class NoticeOut(Schema):
    outcome: str = Field(description="sent, retrying, failed (a 4xx, or every attempt failed) or not queued")
    detail: str = Field(description="The webhook's answer (HTTP 200) or why it failed")
    attempts: int
    at: datetime


class TtftOut(Schema):
    source: str = Field(description="server (TTFT as vLLM measured it) or client (as the client saw it)")
    p90_before_seconds: float = Field(description="Before the change: the per-point p90s' geometric mean")
    p90_after_seconds: float
    p90_now_seconds: float = Field(description="Over the last minutes with enough requests")
    ratio: float = Field(description="p90 after over before")


class PairRequestOut(Schema):
    server: str
    request_id: str
    arrived_at: datetime
    version: str | None = Field(description="Its template version's commit sha; null: none known")


class PairOut(Schema):
    before: PairRequestOut = Field(
        description="The last request of the template and tenant before the change"
    )
    after: PairRequestOut = Field(
        description="The first request after the change that lost tokens to the prompt changing"
    )
    departs_at_token: int | None = Field(description="The first token where `after` departs from before")
    compare_slug: str | None = Field(description="The pair's Compare permalink: GET /api/v1/compare/{slug}")
    compare_url: str | None = Field(description="The Compare page of the two, token by token")


class RegressionOut(Schema):
    id: int
    scope: Scope
    template: str | None
    server: str | None
    tenant: str
    metric: Metric
    kind: Kind
    expected: bool = Field(description="Transient by nature (a salt rotation, a restart): closes once warm")
    state: StateFilter
    changed_at: datetime = Field(description="The first minute after the change point")
    detected_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    resolution: str = Field(
        description="Why it was resolved: recovered, reverted (its suspect), idle (its scope)"
    )
    rate_before: float = Field(description="The hit rate; for a TTFT regression, over the same minutes")
    rate_after: float
    rate_now: float
    hit_rate_definition: str = Field(
        description="What rate_before, rate_after and rate_now are the share of: a template's of its "
        "reusable prompt tokens, a server's, tenant's or fleet's less its prompt changes too"
    )
    requests_before: int
    requests_after: int
    confidence: float
    method: dict[str, Any] = Field(description="The detection method, its parameters and figures")
    suspect_commit_sha: str | None
    candidates: list[CandidateOut]
    cause_shift: dict[str, dict[str, float]] = Field(
        description="Each cause's lost tokens as a share of the prompt tokens, before and after"
    )
    cost: CostOut
    killers: list[FrozenKillerOut] = Field(
        description="A template regression's cache killers found since the change while it was open, kept "
        "with it (later searches do not change them); samples null: their text is served by "
        "GET /api/v1/templates/{template}/killers?samples=true while the template's search still finds them"
    )
    webhook: dict[str, NoticeOut] = Field(
        description="The webhook's last outcome for each event told (opened, resolved); {} when none was"
    )
    ttft: TtftOut | None = Field(description="A TTFT regression's figures")
    pair: PairOut | None = Field(
        description="A template regression's evidence: a request before the change and one after it, "
        "where the after one departs, and their Compare permalink; null when none was found"
    )
    note: str

    @staticmethod
    def resolve_template(regression: Regression) -> str | None:
        return regression.template.name if regression.template else None

    @staticmethod
    def resolve_server(regression: Regression) -> str | None:
        return regression.server.name if regression.server else None

    @staticmethod
    def resolve_suspect_commit_sha(regression: Regression) -> str | None:
        return regression.suspect_version.commit_sha if regression.suspect_version else None

    @staticmethod
    def resolve_killers(regression: Regression, context: dict[str, Any]) -> list[dict[str, Any]]:
        """The frozen killers, each listing the sample requests the caller sees."""
        frozen = evidence.frozen_killers(regression)
        if not frozen:
            return []
        viewer = caller_viewer(context["request"])
        names = dict(viewer.servers(Server.objects.all()).values_list("pk", "name"))
        _, seen = visible_killers([f.killer for f in frozen], viewer=viewer)
        return [killer_out(f.killer, names, None, None, seen) | {"found_at": f.found_at} for f in frozen]

    @staticmethod
    def resolve_pair(regression: Regression, context: dict[str, Any]) -> PairOut | None:
        pair = evidence.evidence_pair(regression)
        if pair is None:
            return None
        slug = pair.compare_slug
        page = context["request"].build_absolute_uri(reverse("compare:detail", args=[slug])) if slug else None
        return PairOut(
            before=PairRequestOut(**asdict(pair.before)), after=PairRequestOut(**asdict(pair.after)),
            departs_at_token=pair.departs_at_token, compare_slug=slug, compare_url=page,
        )  # fmt: skip

    @staticmethod
    def resolve_webhook(regression: Regression) -> dict[str, Any]:
        return dict(regression.evidence.get("webhook", {}))

    @staticmethod
    def resolve_ttft(regression: Regression) -> TtftOut | None:
        before, after = regression.ttft_before_seconds, regression.ttft_after_seconds
        if regression.metric != Regression.Metric.TTFT or not before or after is None:
            return None
        return TtftOut(
            source=str(regression.method.get("ttft_source", "")),
            p90_before_seconds=before,
            p90_after_seconds=after,
            p90_now_seconds=regression.ttft_now_seconds or after,
            ratio=after / before,
        )

    @staticmethod
    def resolve_cost(regression: Regression) -> CostOut:
        since, until = cost_window_of(regression)
        return CostOut(
            since=since,
            until=until,
            counts=COUNTS[regression.template_id is not None],
            scope_lost_tokens_per_hour=regression.scope_lost_tokens_per_hour,
            lost_tokens_per_hour=regression.lost_tokens_per_hour,
            prefill_tokens_per_second=regression.prefill_tokens_per_second,
            prefill_rate_source=regression.prefill_rate_source,
            gpu_seconds_per_hour=regression.gpu_seconds_per_hour,
            cost_per_hour=regression.cost_per_hour,
        )


class NoteIn(Schema):
    state: Literal["open", "acknowledged", "muted"]
    note: str = Field("", max_length=2000)


@router.get(
    "/regressions",
    auth=READERS,
    response=list[RegressionOut],
    summary="Regressions, newest change first",
    description="Active ones (not resolved) by default. " + READ_AUTH,
    url_name="regressions",
)
@paginate(Pages)
def list_regressions(request: HttpRequest, filters: Query[RegressionFilters]) -> Any:
    return selectors.regressions(
        state=filters.state, scope=filters.scope or "", metric=filters.metric or "", kind=filters.kind or "",
        viewer=caller_viewer(request),
    )  # fmt: skip


@router.get(
    "/regressions/{regression_id}",
    auth=READERS,
    response={200: RegressionOut, 404: ApiError},
    summary="A regression, with its attribution, cause shift and cost",
    description=READ_AUTH,
    url_name="regression",
)
def get_regression(request: HttpRequest, regression_id: int) -> Any:
    regression = (
        selectors.regressions(state="all", viewer=caller_viewer(request)).filter(pk=regression_id).first()
    )
    return regression if regression is not None else error(404, "no such regression")


@router.post(
    "/regressions/{regression_id}/note",
    auth=PEOPLE,
    response={200: RegressionOut, 404: ApiError},
    summary="Acknowledge or mute a regression, or open it again, with a note",
    description="A person's: a logged-in user's session, with Django's CSRF token as X-CSRFToken, or "
    "personal API token. A resolved regression stays resolved; its note is saved.",
    url_name="regression-note",
)
def note_regression(request: HttpRequest, regression_id: int, body: NoteIn) -> Any:
    regression = (
        selectors.regressions(state="all", viewer=caller_viewer(request)).filter(pk=regression_id).first()
    )
    if regression is None:
        return error(404, "no such regression")
    return services.note_regression(
        regression, state=body.state, note=body.note, user=request.user, now=timezone.now()
    )
