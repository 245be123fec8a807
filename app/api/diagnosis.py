"""Why requests missed: each request's diagnosis, and lost tokens by cause."""

from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status
from ninja.security import django_auth

from app.api.schemas import ErrorAnswer
from app.traffic.selectors import DiagnosedRequest, diagnosed_requests, lost_tokens_by_cause

router = Router(tags=["diagnosis"], auth=django_auth)


class Funnel(Schema):
    prompt_tokens: int
    seen_before_tokens: int = Field(description="leading tokens seen before under its salt, anywhere")
    resident_anywhere_tokens: int = Field(description="leading tokens on the compatible server holding most")
    resident_here_tokens: int = Field(description="leading tokens resident on its own server at arrival")
    reused_tokens: int = Field(description="cached tokens, as vLLM reported them")


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
    diverged_at: int | None = Field(description="prompt_changed: the first token departing from its template")
    unexpected_hit: bool
    funnel: Funnel | None
    lost_tokens: dict[str, int] = Field(description="by cause; causes that lost nothing left out")
    losses: list[dict[str, Any]] = Field(description="runs of blocks lost to one cause, in prompt order")


@router.get(
    "/requests/{server}/{request_id}/diagnosis",
    response={200: list[Diagnosed], 404: ErrorAnswer},
    summary="Why a request missed",
    description="Every record of the request id on that server (one per arrival), newest first.",
)
def request_diagnosis(request: HttpRequest, server: str, request_id: str) -> Any:
    found = diagnosed_requests(server_name=server, request_id=request_id)
    if not found:
        return Status(404, {"error": "no such request on that server"})
    return [_answer(item) for item in found]


def _answer(item: DiagnosedRequest) -> dict[str, Any]:
    record, diagnosis = item.record, item.diagnosis
    answer: dict[str, Any] = {
        "server": record.server.name, "request_id": record.request_id, "arrived_at": record.arrived_at,
        "template": record.template.name if record.template else None,
        "template_version": record.template_version.commit_sha if record.template_version else None,
        "tenant": record.tenant, "diagnosed": diagnosis is not None, "cause": None, "unknown": None,
        "diverged_at": None, "unexpected_hit": False, "funnel": None, "lost_tokens": {}, "losses": [],
    }  # fmt: skip
    if diagnosis is not None:
        answer |= {
            "cause": diagnosis.cause or None, "unknown": diagnosis.unknown or None,
            "diverged_at": diagnosis.diverged_at, "unexpected_hit": diagnosis.unexpected_hit,
            "funnel": diagnosis, "lost_tokens": item.lost_tokens(), "losses": diagnosis.losses,
        }  # fmt: skip
    return answer


class CauseWindow(Schema):
    since: datetime | None = Field(None, description="default: an hour before `until`")
    until: datetime | None = Field(None, description="default: now")


@router.get("/miss-causes", response=dict[str, int], summary="Prompt tokens lost per cause")
def miss_causes(request: HttpRequest, window: Query[CauseWindow]) -> dict[str, int]:
    until = window.until or timezone.now()
    return lost_tokens_by_cause(since=window.since or until - timedelta(hours=1), until=until)
