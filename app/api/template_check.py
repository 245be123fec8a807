"""The template check over HTTP, for CI systems that would rather POST than install Prefixscope: a
registered repository's commit range checked here (builder commands never run on the server) and
priced with this server's own traffic of the templates, by the product's one cost model. The answer
is the check's JSON report (or its SARIF log) with the exit status a CI job would have had."""

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Router, Schema

from app.api.auth import READ_AUTH, READERS
from app.api.errors import ApiError, error
from app.api.viewers import caller_viewer
from app.core.tenancy import Viewer
from app.diagnosis.template_traffic import check_traffic, traffic_window
from app.domain.templatecheck.price import Traffic
from app.domain.templatecheck.report import json_report, sarif_report
from app.prompts import selectors
from app.prompts.templatecheck.run import CannotCheck, CheckRequest, run_check

router = Router(tags=["templates"])


class CheckIn(Schema):
    repository: str = Field(min_length=1, max_length=200, description="A registered repository's name")
    base: str = Field(min_length=1, max_length=250, description="The commit, branch or tag before the change")
    head: str = Field(min_length=1, max_length=250, description="The commit, branch or tag to check")
    hours: int = Field(24, ge=1, le=168, description="The traffic window the change is priced with")
    max_cost_per_hour: float | None = Field(None, ge=0, description="Fail a change costing more an hour")
    format: Literal["json", "sarif"] = "json"


@router.post(
    "/templates/check",
    auth=READERS,
    response={200: dict[str, Any], 400: ApiError, 404: ApiError},
    summary="Check a template repository's commit range before it ships",
    description="Renders each template of a registered repository at `base` and `head` (Jinja only: "
    "builder commands run in the repository's own CI), and reports determinism, the boundary marker, "
    "the stable prefix's change and golden copy, priced with this server's traffic of the last `hours`. "
    "The JSON report carries `exit_status` (0 passed, 1 failed); a check that cannot run (no such "
    "commit, a bad prefixscope.yaml) is answered 400 with code `cannot_check`. docs/template-check.md. "
    + READ_AUTH,
    url_name="templates-check",
)
def check_templates(request: HttpRequest, body: CheckIn) -> Any:
    viewer = caller_viewer(request)
    repository = selectors.repositories(viewer=viewer).filter(name=body.repository).first()
    if repository is None:
        return error(404, f"no repository named {body.repository!r}")
    now = timezone.now()
    checked = CheckRequest(
        repository.location, body.base, body.head, now, hours=body.hours,
        max_cost_per_hour=body.max_cost_per_hour, allow_commands=False,
        traffic=lambda names: _traffic(names, viewer=viewer, hours=body.hours, now=now),
    )  # fmt: skip
    try:
        report = run_check(checked, cache=Path(settings.PREFIXSCOPE_TEMPLATE_CACHE_DIR))
    except CannotCheck as exc:
        return error(400, str(exc), code="cannot_check")
    return sarif_report(report, version="api") if body.format == "sarif" else json_report(report)


def _traffic(names: Sequence[str], *, viewer: Viewer, hours: int, now: datetime) -> Mapping[str, Traffic]:
    """This server's traffic of the named templates the viewer sees, as the check prices it."""
    templates = selectors.chosen_templates(viewer=viewer, names=list(names))
    return check_traffic(templates, window=traffic_window(now=now, hours=hours), viewer=viewer)
