"""Each template's live traffic over the last hours: what the template check (issue 25) prices a
template change with, in a prompt-template repository's CI. Read from the request rollups
(app/diagnosis/template_traffic.py); a user's session or personal token, their tenants' templates."""

from datetime import datetime
from typing import Any, Literal

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema

from app.api.auth import READ_AUTH, READERS
from app.api.errors import ApiError, error
from app.api.viewers import caller_viewer
from app.diagnosis.template_traffic import template_traffic, traffic_window
from app.prompts import selectors

router = Router(tags=["templates"])
MAX_NAMES = 500  # a repository's templates, with room; bounds the lookups one call makes


class TrafficQuery(Schema):
    hours: int = Field(
        24, ge=1, le=168, description="The window: the last `hours` whole hours, to the minute"
    )
    name: list[str] = Field(
        [], max_length=MAX_NAMES, description="Only these templates (a name or an id; repeat it for more)"
    )
    repository: str | None = Field(None, min_length=1, description="Only the templates of this repository")


class TemplateTrafficOut(Schema):
    name: str
    repository: str | None = Field(description="Its repository's name; null: none")
    path: str = Field(description="Its file in the repository; blank: not imported")
    requests: int = Field(description="Its requests in the window")
    requests_per_hour: float = Field(
        description="requests over the window's hours from its first request on (when that is later "
        "than the window's start: a template live for ten minutes is not spread over the window)"
    )
    prompt_tokens_per_request: float = Field(description="Mean prompt tokens per request over the window")
    reused_tokens_per_request: float = Field(
        description="Mean cached (reused) prompt tokens per request now: over the window's last hour, "
        "else (no request of it reported its cached tokens) over the window; 0 when none did"
    )
    reused_window: Literal["hour", "window"] = Field(description="What reused_tokens_per_request is of")
    block_size: int | None = Field(
        description="The block size of the servers that served most of its requests; null: unknown"
    )
    prefill_tokens_per_second: float = Field(
        description="Its requests' prefill rate over the window, else the configured one"
    )
    prefill_rate_source: Literal["measured", "configured"]


class TrafficOut(Schema):
    since: datetime
    until: datetime
    recent_since: datetime = Field(description="The start of the last hour (reused_window=hour)")
    gpu_hour_price: float = Field(description="The configured price of a GPU-hour")
    templates: list[TemplateTrafficOut] = Field(description="By name; those without requests too")


@router.get(
    "/templates/traffic",
    auth=READERS,
    response={200: TrafficOut, 404: ApiError},
    summary="Each template's traffic over the last hours, to price a template change",
    description="Per template the viewer sees (of `repository`, named by `name` when given): requests "
    "an hour, prompt and reused tokens per request, the block size that served it and its measured "
    "prefill rate, over [now - hours, now) on whole minutes, from the rollups. What the template check "
    "prices a change with, by the product's one cost model. " + READ_AUTH,
    url_name="templates-traffic",
)
def get_template_traffic(request: HttpRequest, query: Query[TrafficQuery]) -> Any:
    viewer = caller_viewer(request)
    repository = None
    if query.repository is not None:
        repository = selectors.repositories(viewer=viewer).filter(name=query.repository).first()
        if repository is None:
            return error(404, f"no repository named {query.repository!r}")
    templates = selectors.chosen_templates(viewer=viewer, names=query.name, repository=repository)
    window = traffic_window(now=timezone.now(), hours=query.hours)
    return {
        "since": window.since, "until": window.until, "recent_since": window.recent_since,
        "gpu_hour_price": settings.PREFIXSCOPE_GPU_HOUR_PRICE,
        "templates": template_traffic(templates, window=window, viewer=viewer),
    }  # fmt: skip
