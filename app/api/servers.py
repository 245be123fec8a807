"""Servers: register, change, disable or enable, and accept or merge the proposed ones that ingested
data named. Staff only (app/api/auth.py); every change goes through app/fleet/services.py (a merge
through app/rollups/merge.py), as the set-up pages' do."""

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from ninja.pagination import paginate
from pydantic import field_validator

from app.api.auth import READ_AUTH, READERS, STAFF, STAFF_AUTH
from app.api.errors import ApiError, error
from app.api.pages import Pages, Rows
from app.api.viewers import caller_viewer
from app.fleet import selectors as fleet_selectors
from app.fleet import services
from app.fleet.endpoints import http_url_problem, zmq_endpoint_problem
from app.fleet.models import Server
from app.prompts import git
from app.rollups.merge import merge_server

router = Router(tags=["servers"], auth=STAFF)

NAME_PATTERN = r"^[-a-zA-Z0-9_]+$"
GROUP_HELP = (
    "The team that runs it (letters, digits, - and _): the `owner` of its capacity, restart and "
    "KV-stream alerts, which Alertmanager routes on"
)


class EndpointsIn(Schema):
    base_url: str = Field(max_length=200, description="OpenAI-compatible API root, e.g. http://vllm-0:8000")
    metrics_url: str = Field("", max_length=200, description="Blank: <base_url>/metrics")
    kv_events_endpoint: str = Field("", max_length=255, description="ZMQ PUB, tcp://host:5557; blank: none")
    kv_replay_endpoint: str = Field("", max_length=255, description="ZMQ ROUTER, tcp://host:5558")
    kv_topic: str = Field("", max_length=255)
    model: str = Field("", max_length=255, description="Blank: read from its /metrics")
    tenant: str = Field("", max_length=100, description="Tenant whose users may see it; blank: all")
    group: str = Field("platform", min_length=1, max_length=100, pattern=NAME_PATTERN, description=GROUP_HELP)
    scrape_interval_seconds: int = Field(15, ge=1, le=3600)

    @field_validator("base_url", "metrics_url")
    @classmethod
    def _http(cls, url: str) -> str:
        if url and (problem := http_url_problem(url)):
            raise ValueError(problem)
        return url

    @field_validator("kv_events_endpoint", "kv_replay_endpoint")
    @classmethod
    def _zmq(cls, endpoint: str) -> str:
        if endpoint and (problem := zmq_endpoint_problem(endpoint)):
            raise ValueError(problem)
        return endpoint


class ServerIn(EndpointsIn):
    name: str = Field(
        min_length=1, max_length=100, pattern=NAME_PATTERN, description="Letters, digits, - and _"
    )


class AcceptIn(Schema):
    base_url: str = Field(max_length=200, description="Where its /metrics is pulled from")

    @field_validator("base_url")
    @classmethod
    def _http(cls, url: str) -> str:
        if problem := http_url_problem(url):
            raise ValueError(problem)
        return url


class MergeIn(Schema):
    into: int = Field(description="The id of the registered server it stands for")


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
    group: str = Field(description=GROUP_HELP)
    state: Literal["proposed", "active", "down", "disabled"]
    scrape_interval_seconds: int
    last_scraped_at: datetime | None
    metrics_url: str = Field(description="Blank: <base_url>/metrics; without credentials")
    kv_events_endpoint: str = Field(description="ZMQ PUB its KV events are subscribed to; blank: none")
    kv_replay_endpoint: str
    kv_topic: str
    kv_events: bool = Field(description="Its KV events are subscribed to")
    created_at: datetime

    @staticmethod
    def of(server: Server) -> dict[str, Any]:
        return {
            "id": server.pk, "name": server.name, "base_url": git.redacted(server.base_url),
            "model": server.model, "base_models": [str(name) for name in server.base_models or []],
            "lora_adapters": sorted(str(name) for name in (server.lora_adapters or {})),
            "block_size": server.block_size, "hash_algo": server.hash_algo, "tenant": server.tenant,
            "group": server.group, "state": server.state,
            "scrape_interval_seconds": server.scrape_interval_seconds,
            "last_scraped_at": server.last_scraped_at, "kv_events": bool(server.kv_events_endpoint),
            "metrics_url": git.redacted(server.metrics_url), "kv_events_endpoint": server.kv_events_endpoint,
            "kv_replay_endpoint": server.kv_replay_endpoint, "kv_topic": server.kv_topic,
            "created_at": server.created_at,
        }  # fmt: skip


class ServerFilters(Schema):
    state: Literal["proposed", "active", "down", "disabled"] | None = None
    model: str | None = Field(None, description="Servers of this model")


class MergedOut(Schema):
    moved: int = Field(description="Request records moved to the registered server")
    joined: int = Field(description="Records joined to a record of the same request it had")


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
    found = fleet_selectors.servers(state=filters.state or "", model=filters.model or "")
    return Rows(caller_viewer(request).servers(found), ServerOut.of)


@router.get(
    "/servers/{server_id}",
    auth=READERS,
    response={200: ServerOut, 404: ApiError},
    summary="A server",
    description=READ_AUTH,
    url_name="server",
)
def get_server(request: HttpRequest, server_id: str) -> Any:
    """By name, or by id (the writes' key); one path, so that the writes below share it."""
    server = _visible(request, server_id)
    return ServerOut.of(server) if server else error(404, "no such server")


def _visible(request: HttpRequest, ident: str | int) -> Server | None:
    servers = caller_viewer(request).servers(Server.objects.all())
    if isinstance(ident, int) or ident.isdigit():
        return servers.filter(pk=int(ident)).first() or servers.filter(name=str(ident)).first()
    return servers.filter(name=ident).first()


@router.post(
    "/servers",
    response={201: ServerOut, 409: ApiError},
    summary="Register a server",
    description="It becomes active: its /metrics pulls begin. 409: a server of that name exists (a proposed "
    "one is accepted instead). " + STAFF_AUTH,
)
def create_server(request: HttpRequest, body: ServerIn) -> Any:
    try:
        return Status(201, ServerOut.of(services.create_server(**body.dict())))
    except services.NameTaken as exc:
        return error(409, str(exc), code="name_taken")


@router.put(
    "/servers/{server_id}",
    response={200: ServerOut, 404: ApiError, 409: ApiError},
    summary="Change a server's endpoints, model, tenant, group or pull interval",
    description="Its name stays: request records name their server by it. A field left out takes its "
    "default (group: platform). 409: the server is proposed. " + STAFF_AUTH,
)
def update_server(request: HttpRequest, server_id: int, body: EndpointsIn) -> Any:
    return _changed(request, server_id, lambda: services.update_server(server_id=server_id, **body.dict()))


@router.post(
    "/servers/{server_id}/disable",
    response={200: ServerOut, 404: ApiError, 409: ApiError},
    summary="Disable a server: its pulls stop, its data stays",
    description=STAFF_AUTH,
)
def disable_server(request: HttpRequest, server_id: int) -> Any:
    return _changed(
        request, server_id, lambda: services.set_server_enabled(server_id=server_id, enabled=False)
    )


@router.post(
    "/servers/{server_id}/enable",
    response={200: ServerOut, 404: ApiError, 409: ApiError},
    summary="Enable a disabled server again",
    description=STAFF_AUTH,
)
def enable_server(request: HttpRequest, server_id: int) -> Any:
    return _changed(
        request, server_id, lambda: services.set_server_enabled(server_id=server_id, enabled=True)
    )


@router.post(
    "/servers/{server_id}/accept",
    response={200: ServerOut, 404: ApiError, 409: ApiError},
    summary="Accept a proposed server at its base URL",
    description="It becomes active and its pulls begin. 409: it is not proposed (any more). " + STAFF_AUTH,
)
def accept_server(request: HttpRequest, server_id: int, body: AcceptIn) -> Any:
    return _changed(
        request, server_id, lambda: services.accept_server(server_id=server_id, base_url=body.base_url)
    )


@router.post(
    "/servers/{server_id}/merge",
    response={200: MergedOut, 404: ApiError, 409: ApiError},
    summary="Merge a proposed server into the registered one it stands for",
    description="Its request records move to that server and it is deleted. 409: it is not proposed, or "
    "`into` is. " + STAFF_AUTH,
)
def merge_proposed_server(request: HttpRequest, server_id: int, body: MergeIn) -> Any:
    return _changed(request, server_id, lambda: merge_server(server_id=server_id, into_id=body.into))


def _changed(request: HttpRequest, server_id: int, change: Callable[[], object]) -> Any:
    """The change's result; 404 for a server that is not there or that the caller does not see (a
    staff member of one tenant changes its servers alone), 409 for one in the wrong state."""
    if _visible(request, server_id) is None:
        return error(404, "no such server")
    try:
        changed = change()
    except services.ServerGone as exc:
        return error(404, str(exc))
    except services.ServerStateError as exc:
        return error(409, str(exc), code="wrong_state")
    return ServerOut.of(changed) if isinstance(changed, Server) else changed
