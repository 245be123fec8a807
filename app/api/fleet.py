"""Reads of the fleet for scripts: its hit rates, deploy markers and cache killers across templates
(its servers: app/api/servers.py, one router with their writes: django-ninja routes a path to one
router).

Authenticated as the other reads are: a logged-in user's session, or an ingest token. Registering
and changing servers is not here (the set-up API). Lists come a page at a time (`limit`, `offset`).
"""

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema
from ninja.pagination import paginate

from app.api.auth import READ_AUTH, READERS
from app.api.errors import ApiError, error
from app.api.pages import Pages, Rows
from app.api.schemas import Instant
from app.api.templates import DeployOut, KillerOut, killer_out
from app.api.templates import router as templates_router
from app.api.viewers import caller_viewer
from app.compare.killers import visible_killers
from app.core.tenancy import Viewer
from app.domain.misses import HIT_RATE_DEFINITIONS
from app.fleet.models import Server
from app.prompts import killers
from app.prompts import selectors as prompt_selectors
from app.prompts.models import CacheKiller, DeployMarker, Template
from app.rollups.hitrates import fleet_hit_rates

router = Router(tags=["fleet"])

LONGEST_WINDOW = timedelta(days=31)  # a month of the hour rollups: 744 rows a server


class HitRateOut(Schema):
    name: str = Field(description="The definition's name (recorded, counters, hosted)")
    hit_rate: float | None = Field(description="A share of 0 to 1; null when nothing was counted")
    hit_rate_definition: str = Field(description="What it is the share of, and of which requests")


class FleetHitRatesOut(Schema):
    since: datetime
    until: datetime
    hit_rates: list[HitRateOut]


class WindowIn(Schema):
    since: Instant | None = Field(None, description="Default: an hour before `until`")
    until: Instant | None = Field(None, description="Default: now")


@router.get(
    "/fleet/hit-rates",
    auth=READERS,
    response={200: FleetHitRatesOut, 400: ApiError},
    summary="The fleet's hit rates over a window, each with its definition",
    description="Of its recorded requests (hosted-API ones included), of its servers' own prefix-cache "
    "counters, and of its hosted-API requests alone (cache read / input tokens, as their providers "
    "report them), from the rollups; of the traffic the caller sees. " + READ_AUTH,
    url_name="fleet-hit-rates",
)
def get_fleet_hit_rates(request: HttpRequest, window: Query[WindowIn]) -> Any:
    until = window.until or timezone.now()
    since = window.since or until - timedelta(hours=1)
    if not since < until <= since + LONGEST_WINDOW:
        return error(400, "since must be before until, at most 31 days before", code="bad_window")
    viewer = caller_viewer(request)
    rates = fleet_hit_rates(viewer.servers(Server.objects.all()), [(since, until)], viewer=viewer)[0]
    return FleetHitRatesOut(
        since=since, until=until,
        hit_rates=[HitRateOut(name=name, hit_rate=rate, hit_rate_definition=HIT_RATE_DEFINITIONS[name])
                   for name, rate in rates.by_definition().items()],
    )  # fmt: skip


class DeployFilters(Schema):
    template: str | None = Field(None, description="A template's name, or its id")
    server: str | None = Field(None, description="A server's name: its markers and the fleet-wide ones")
    since: Instant | None = Field(None, description="Deployed at or after")
    until: Instant | None = Field(None, description="Deployed before")


# On the templates router, which has POST /deploys: django-ninja routes a path to the first router
# declaring it, so a GET declared on another router would meet a 405.
@templates_router.get(
    "/deploys",
    auth=READERS,
    tags=["templates"],
    response=list[DeployOut],
    summary="Deploy markers, latest first",
    description="When template versions went live: recorded (POST /api/v1/deploys) or the first request "
    "naming a version (source=traffic). " + READ_AUTH,
    url_name="deploys",
)
@paginate(Pages)
def list_deploys(request: HttpRequest, filters: Query[DeployFilters]) -> Any:
    viewer = caller_viewer(request)
    found = prompt_selectors.deploys(
        template=_template_name(filters.template, viewer), server=filters.server or "",
        since=filters.since, until=filters.until,
    )  # fmt: skip
    seen = found.filter(template_version__template__in=viewer.templates(Template.objects.all()).values("pk"))
    return Rows(
        seen.filter(Q(server=None) | Q(server__in=viewer.servers(Server.objects.all()).values("pk"))), _deploy
    )


def _template_name(given: str | None, viewer: Viewer) -> str:
    """The name of the template a filter names by its name or id ("": no filter); one matching
    none is kept as given, so that the list is empty."""
    if not given:
        return ""
    template = prompt_selectors.find_template(given, viewer=viewer)
    return template.name if template else given


def _deploy(marker: DeployMarker) -> dict[str, Any]:
    version = marker.template_version
    return {
        "id": marker.pk, "template": version.template.name, "version": version.commit_sha,
        "server": marker.server.name if marker.server else None, "deployed_at": marker.deployed_at,
        "note": marker.note, "source": marker.source,
    }  # fmt: skip


class FleetKillerOut(KillerOut):
    template: str
    template_id: int
    computed_at: datetime


class KillerFilters(Schema):
    template: str | None = Field(None, description="A template's name, or its id")
    kind: CacheKiller.Kind | None = None


@router.get(
    "/killers",
    auth=READERS,
    response=list[FleetKillerOut],
    summary="Cache killers of every template, costliest first",
    description="The token positions where each template's traffic fans out, with their cost; without "
    "prompt text (a template's own list gives samples: GET /api/v1/templates/{template}/killers). "
    + READ_AUTH,
    url_name="killers",
)
@paginate(Pages)
def list_killers(request: HttpRequest, filters: Query[KillerFilters]) -> Any:
    viewer = caller_viewer(request)
    found = killers.fleet_killers(template=_template_name(filters.template, viewer), kind=filters.kind or "")
    if not viewer.sees_all:  # a tenant sees a killer through one of its samples (app/compare/killers.py)
        found = found.filter(pk__in=[killer.pk for killer in visible_killers(list(found), viewer=viewer)[0]])
    names = dict(viewer.servers(Server.objects.all()).values_list("pk", "name"))
    return Rows(found, lambda killer: _killer(killer, names))


def _killer(killer: CacheKiller, names: dict[int, str]) -> dict[str, Any]:
    where = {
        "template": killer.template.name,
        "template_id": killer.template_id,
        "computed_at": killer.computed_at,
    }
    return killer_out(killer, names, None, None) | where
