"""Reads of the fleet for scripts: its servers, deploy markers and cache killers across templates.

Authenticated as the other reads are: a logged-in user's session, or an ingest token. Registering
and changing servers is not here (the set-up API). Lists come a page at a time (`limit`, `offset`).
"""

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.pagination import paginate

from app.api.errors import ApiError, error
from app.api.pages import Pages, Rows
from app.api.schemas import Instant
from app.api.templates import READ_AUTH, READERS, DeployOut, KillerOut, killer_out
from app.api.templates import router as templates_router
from app.fleet import selectors as fleet_selectors
from app.fleet.models import Server
from app.prompts import git, killers
from app.prompts import selectors as prompt_selectors
from app.prompts.models import CacheKiller, DeployMarker

router = Router(tags=["fleet"])


class ServerOut(Schema):
    id: int
    name: str
    base_url: str = Field(description="Without the credentials a URL may carry")
    model: str
    base_models: list[str] = Field(description="The names its base model is served under, per /v1/models")
    lora_adapters: list[str] = Field(description="The LoRA adapters it serves, per /v1/models")
    block_size: int | None = Field(description="From vllm:cache_config_info; null until first scraped")
    hash_algo: str
    tenant: str = Field(description="The tenant whose users may see it; blank: all")
    state: Literal["proposed", "active", "down", "disabled"]
    scrape_interval_seconds: int
    last_scraped_at: datetime | None
    kv_events: bool = Field(description="Its KV events are subscribed to")
    created_at: datetime

    @staticmethod
    def of(server: Server) -> dict[str, Any]:
        return {
            "id": server.pk, "name": server.name, "base_url": git.redacted(server.base_url),
            "model": server.model, "base_models": [str(name) for name in server.base_models or []],
            "lora_adapters": sorted(str(name) for name in (server.lora_adapters or {})),
            "block_size": server.block_size, "hash_algo": server.hash_algo, "tenant": server.tenant,
            "state": server.state, "scrape_interval_seconds": server.scrape_interval_seconds,
            "last_scraped_at": server.last_scraped_at, "kv_events": bool(server.kv_events_endpoint),
            "created_at": server.created_at,
        }  # fmt: skip


class ServerFilters(Schema):
    state: Literal["proposed", "active", "down", "disabled"] | None = None
    model: str | None = Field(None, description="Servers of this model")


@router.get(
    "/servers",
    auth=READERS,
    response=list[ServerOut],
    summary="Servers, by name",
    description=READ_AUTH,
    url_name="servers",
)
@paginate(Pages)
def list_servers(request: HttpRequest, filters: Query[ServerFilters]) -> Any:
    return Rows(fleet_selectors.servers(state=filters.state or "", model=filters.model or ""), ServerOut.of)


@router.get(
    "/servers/{name}",
    auth=READERS,
    response={200: ServerOut, 404: ApiError},
    summary="A server",
    description=READ_AUTH,
    url_name="server",
)
def get_server(request: HttpRequest, name: str) -> Any:
    server = Server.objects.filter(name=name).first()
    return ServerOut.of(server) if server else error(404, "no such server")


class DeployFilters(Schema):
    template: str | None = Field(None, description="A template's name")
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
    found = prompt_selectors.deploys(
        template=filters.template or "", server=filters.server or "", since=filters.since, until=filters.until
    )
    return Rows(found, _deploy)


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
    template: str | None = Field(None, description="A template's name")
    kind: CacheKiller.Kind | None = None


@router.get(
    "/killers",
    auth=READERS,
    response=list[FleetKillerOut],
    summary="Cache killers of every template, costliest first",
    description="The token positions where each template's traffic fans out, with their cost; without "
    "prompt text (a template's own list gives samples: GET /api/v1/templates/{id}/killers). " + READ_AUTH,
    url_name="killers",
)
@paginate(Pages)
def list_killers(request: HttpRequest, filters: Query[KillerFilters]) -> Any:
    found = killers.fleet_killers(template=filters.template or "", kind=filters.kind or "")
    names = dict(Server.objects.values_list("pk", "name"))
    return Rows(found, lambda killer: _killer(killer, names))


def _killer(killer: CacheKiller, names: dict[int, str]) -> dict[str, Any]:
    where = {
        "template": killer.template.name,
        "template_id": killer.template_id,
        "computed_at": killer.computed_at,
    }
    return killer_out(killer, names, None, None) | where
