"""What-if questions over REST: a scope and a window asked (the Celery task `whatif.answer` replays it),
polled until answered, listed; the answers are kept with the question (app/whatif).

A person's: a logged-in user's session (a POST sends Django's CSRF token as X-CSRFToken) or personal
API token, as the regressions' note and the template check. Not an ingest token's: the answers read
the fleet's traffic, which an ingest token never reads. A question counts the requests of the tenants
its asker sees, so it is read only by a viewer of the same tenants (or one who sees all): another
tenant's question is a 404, as every row a viewer may not see.
"""

from datetime import datetime, timedelta
from typing import Any, Literal

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status
from ninja.pagination import paginate

from app.api.auth import PEOPLE, READERS
from app.api.errors import ApiError, error
from app.api.pages import Pages
from app.api.schemas import Instant
from app.api.viewers import caller_viewer
from app.core.tenancy import Viewer
from app.domain.misses import OF_REPLAYED
from app.whatif import questions, selectors
from app.whatif.models import WhatIfQuestion
from app.whatif.results import answers_out
from app.whatif.services import MAX_WINDOW, Scope, ScopeKind, scope_visible, window_problem

router = Router(tags=["whatif"])

DEFAULT_MINUTES = 10
MAX_MINUTES = int(MAX_WINDOW.total_seconds() // 60)
ScopeName = Literal["fleet", "group", "template"]
AUTH = (
    "A person's: a logged-in user's session (send Django's CSRF token as X-CSRFToken) or personal API "
    "token (Authorization: Bearer)."
)


class QuestionIn(Schema):
    scope: ScopeName = Field(description="fleet, group (a server group) or template")
    name: str = Field("", max_length=200, description="The group's or template's name; '' for the fleet")
    since: Instant | None = Field(None, description="ISO 8601; with `until` (default: now)")
    until: Instant | None = Field(None, description="ISO 8601; needs `since`")
    minutes: int | None = Field(
        None,
        ge=1,
        le=MAX_MINUTES,
        description=f"The last so many minutes, ending now (default {DEFAULT_MINUTES})",
    )


class QuestionOut(Schema):
    id: int
    scope: ScopeName
    name: str
    since: datetime
    until: datetime
    state: Literal["queued", "running", "done", "failed"]
    progress: float = Field(description="0 to 1 while it runs")
    error: str = Field(description="Why it failed (nothing to replay in the window, say); '' otherwise")
    asked_at: datetime
    finished_at: datetime | None
    url: str = Field(description="Where to poll it: GET /api/v1/whatif/{id}")

    @staticmethod
    def resolve_url(question: WhatIfQuestion, context: dict[str, Any]) -> str:
        return str(context["request"].build_absolute_uri(reverse("api:whatif", args=[question.pk])))


class ServerOut(Schema):
    name: str
    num_blocks: int = Field(description="KV blocks, vLLM's null block counted (num_gpu_blocks)")
    effective_block: int = Field(
        description="A hit is whole steps of this many tokens (a hybrid model's effective block); "
        "0: whole blocks"
    )
    drops_last: bool = Field(description="The last block matched is dropped first (EAGLE/MTP drafting)")


class RestartOut(Schema):
    at: Instant = Field(description="Where its KV events began a new epoch (a restart or a capacity cut)")
    server: str
    num_blocks: int = Field(description="The KV blocks it restarted with")


class PriceOut(Schema):
    tokens_per_second: float = Field(description="The prefill rate the answers are priced at")
    gpu_hour_price: float
    rate_source: str = Field(description="measured (the window's requests' TTFT) or configured")


class CalibrationOut(Schema):
    requests: int = Field(description="The counted requests whose engine reported its cached tokens")
    prompt_tokens: int
    reported_tokens: int = Field(description="Cached tokens the engines reported")
    replayed_tokens: int = Field(description="Reused in the replay of the fleet as it was")
    exact: int = Field(description="Requests whose replayed reuse equals the reported one")
    reported_hit_rate: float | None
    replayed_hit_rate: float | None
    error_points: float | None = Field(description="Replayed minus reported hit rate, in percentage points")
    exact_share: float | None
    uncompared: list[str] = Field(
        description="Servers whose requests were not compared: their hit counter is not wired (they "
        "reported none of the reuse they had)"
    )
    trust: Literal["good", "fair", "poor", "unknown"] = Field(
        description="good: within 2 points; fair: within 5 (directions, not figures); poor: the answers "
        "are not to be trusted; unknown: no request reported its reuse"
    )


class AnswerOut(Schema):
    kind: Literal["as_was", "capacity", "routing", "servers", "block_size", "salts", "restore"]
    label: str
    factor: float | None = Field(description="Capacity: KV blocks as a multiple of today's")
    hit_rate: float | None
    reused_tokens: int
    saved_tokens_per_hour: float = Field(description="Against the fleet as it was; negative: lost")
    gpu_seconds_per_hour: float = Field(description="Of saved_tokens_per_hour, at the prefill rate")
    money_per_hour: float = Field(description="At PREFIXSCOPE_GPU_HOUR_PRICE a GPU-hour")
    ttft_saved_seconds: float = Field(description="Per request, on average: the prefill of the extra reuse")
    mean_wait_seconds: float = Field(description="Waiting for free blocks, per request")


class CurvePointOut(Schema):
    factor: float
    hit_rate: float | None


class AnswersOut(Schema):
    requests: int = Field(description="The requests counted (the scope's, of the asker's tenants)")
    hit_rate_definition: str = Field(
        OF_REPLAYED,
        description="What every answer's hit_rate is; the calibration's reported one: "
        "cached / prompt tokens the engines reported for the same requests",
    )
    prompt_tokens: int
    window_seconds: float
    block_size: int
    servers: list[ServerOut] = Field(description="Each server as the window began")
    restarts: list[RestartOut] = Field(description="Servers started anew in the window, as replayed")
    price: PriceOut | None = Field(description="What priced the answers (null: kept before it was said)")
    trusted: bool = Field(description="False when the calibration is poor: do not read the answers")
    calibration: CalibrationOut
    as_was: AnswerOut
    capacity: list[AnswerOut] = Field(description="KV blocks from a quarter to four times today's")
    curve: list[CurvePointOut] = Field(description="The one-pass hit-rate-versus-capacity curve")
    curve_error_points: float | None = Field(description="The curve against the point replays, at worst")
    routing: list[AnswerOut]
    server_counts: list[AnswerOut] = Field(description="The same KV memory in fewer or more servers")
    block_sizes: list[AnswerOut] = Field(
        description="Over the servers that kept every request's token ids, priced against their own replay"
    )
    block_sizes_left_out: list[str] = Field(
        description="Servers the block sizes leave out: some of their requests kept no token ids"
    )
    salts: list[AnswerOut] = Field(description="Empty unless a request was salted")
    restored: list[AnswerOut] = Field(description="Servers given back the KV blocks they had in the last day")
    leaves_out: str = Field(description="What the TTFT estimate leaves out")


class QuestionDetailOut(QuestionOut):
    answers: AnswersOut | None = Field(description="Once done")

    @staticmethod
    def resolve_answers(question: WhatIfQuestion) -> dict[str, Any] | None:
        answers = questions.answers_of(question)
        return None if answers is None else answers_out(answers)


class QuestionFilters(Schema):
    scope: ScopeName | None = None
    name: str | None = Field(None, max_length=200)


@router.post(
    "/whatif",
    auth=PEOPLE,
    response={202: QuestionOut, 400: ApiError},
    summary="Ask what another configuration would reuse of a scope's window",
    description="Queues the replay of the window (`since`/`until`, or the last `minutes`, default "
    f"{DEFAULT_MINUTES}; at most {MAX_MINUTES // 60} hours) of the fleet, a server group or a template: "
    "the fleet as it was (the calibration), then other KV capacities, routings, server counts, block "
    "sizes, salts. 202 with the question; poll its `url`. 400 with code `bad_window` (an empty, reversed "
    "or too long window, or both `minutes` and `since`), `bad_scope` (a name for the fleet, none for a "
    "group or template) or `unknown_scope` (no group or template of that name that the caller sees). " + AUTH,
    url_name="whatif-ask",
)
def ask_whatif(request: HttpRequest, body: QuestionIn, response: HttpResponse) -> Any:
    viewer = caller_viewer(request)
    window = _window(body, now=timezone.now())
    if isinstance(window, Status):
        return window
    refused = _scope_refused(body, viewer)
    if refused is not None:
        return refused
    question = questions.queue(
        scope=Scope(ScopeKind(body.scope), body.name), since=window[0], until=window[1], viewer=viewer,
        asked_by_id=request.user.pk,
    )  # fmt: skip
    question.refresh_from_db()  # an eager task (tests, no broker) may have answered it already
    response["Location"] = reverse("api:whatif", args=[question.pk])
    return Status(202, question)


@router.get(
    "/whatif/{question_id}",
    auth=READERS,
    response={200: QuestionDetailOut, 404: ApiError},
    summary="A what-if question: its state, progress and, once done, its answers",
    description="The calibration comes first: an answer whose calibration is poor (`trusted` false) "
    "says the replay does not reproduce this fleet. A question asked for other tenants is a 404. " + AUTH,
    url_name="whatif",
)
def get_whatif(request: HttpRequest, question_id: int) -> Any:
    question = selectors.questions(viewer=caller_viewer(request)).filter(pk=question_id).first()
    if question is None:
        return error(404, "no such what-if question")
    return questions.settled(question, now=timezone.now())


@router.get(
    "/whatif",
    auth=READERS,
    response=list[QuestionOut],
    summary="What-if questions, newest first",
    description="Those asked for the caller's tenants, of a scope kind and name when given; without "
    "their answers (GET /api/v1/whatif/{id}). " + AUTH,
    url_name="whatif-list",
)
@paginate(Pages)
def list_whatif(request: HttpRequest, filters: Query[QuestionFilters]) -> Any:
    return selectors.questions(viewer=caller_viewer(request), scope=filters.scope or "", name=filters.name)


def _window(body: QuestionIn, *, now: datetime) -> tuple[datetime, datetime] | Status[dict[str, Any]]:
    """The window asked, or the 400 that says what is wrong with it."""
    if body.minutes is not None and (body.since is not None or body.until is not None):
        return _bad_window("minutes", "give either minutes or since (and until), not both")
    if body.since is None and body.until is not None:
        return _bad_window("since", "until needs since")
    if body.since is None:
        return now - timedelta(minutes=body.minutes or DEFAULT_MINUTES), now
    until = body.until or now
    problem = window_problem(body.since, until)
    return (body.since, until) if problem is None else _bad_window("until", problem)


def _bad_window(field: str, message: str) -> Status[dict[str, Any]]:
    return error(400, message, code="bad_window", fields={field: [message]})


def _scope_refused(body: QuestionIn, viewer: Viewer) -> Status[dict[str, Any]] | None:
    """A 400 for a scope the caller cannot ask: a named fleet, an unnamed group or template, or a
    group or template the caller sees none of (another tenant's is answered as a missing one)."""
    if body.scope == "fleet":
        return None if not body.name else error(400, "the fleet takes no name", code="bad_scope",
                                                fields={"name": ["must be empty for the fleet"]})  # fmt: skip
    if not body.name:
        return error(400, f"a {body.scope} needs its name", code="bad_scope", fields={"name": ["required"]})
    if scope_visible(Scope(ScopeKind(body.scope), body.name), viewer):
        return None
    message = f"no {body.scope} named {body.name!r}"
    return error(400, message, code="unknown_scope", fields={"name": [message]})
