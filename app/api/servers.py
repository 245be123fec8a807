"""Servers: register, change, disable or enable, and accept or merge the proposed ones that ingested
data named. Staff only (app/api/auth.py); every change goes through app/fleet/services.py (a merge
through app/traffic/services/servers.py), as the set-up pages' do."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import field_validator

from app.api.auth import STAFF, STAFF_AUTH
from app.fleet import services
from app.fleet.endpoints import http_url_problem, zmq_endpoint_problem
from app.fleet.models import Server
from app.traffic.services.servers import merge_server

router = Router(tags=["servers"], auth=STAFF)

NAME_PATTERN = r"^[-a-zA-Z0-9_]+$"


class Problem(Schema):
    code: str = Field(description="not_found, name_taken or wrong_state")
    message: str


class EndpointsIn(Schema):
    base_url: str = Field(max_length=200, description="OpenAI-compatible API root, e.g. http://vllm-0:8000")
    metrics_url: str = Field("", max_length=200, description="Blank: <base_url>/metrics")
    kv_events_endpoint: str = Field("", max_length=255, description="ZMQ PUB, tcp://host:5557; blank: none")
    kv_replay_endpoint: str = Field("", max_length=255, description="ZMQ ROUTER, tcp://host:5558")
    kv_topic: str = Field("", max_length=255)
    model: str = Field("", max_length=255, description="Blank: read from its /metrics")
    tenant: str = Field("", max_length=100, description="Tenant whose users may see it; blank: all")
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
    state: str = Field(description="active, down, disabled or proposed")
    base_url: str
    metrics_url: str
    kv_events_endpoint: str
    kv_replay_endpoint: str
    kv_topic: str
    model: str
    tenant: str
    scrape_interval_seconds: int
    block_size: int | None
    hash_algo: str
    last_scraped_at: datetime | None


class MergedOut(Schema):
    moved: int = Field(description="Request records moved to the registered server")
    joined: int = Field(description="Records joined to a record of the same request it had")


@router.get(
    "/servers", response=list[ServerOut], summary="Servers, proposed ones too", description=STAFF_AUTH
)
def list_servers(request: HttpRequest) -> Any:
    return Server.objects.order_by("name")


@router.post(
    "/servers",
    response={201: ServerOut, 409: Problem},
    summary="Register a server",
    description="It becomes active: its /metrics pulls begin. 409: a server of that name exists (a proposed "
    "one is accepted instead). " + STAFF_AUTH,
)
def create_server(request: HttpRequest, body: ServerIn) -> Any:
    try:
        return Status(201, services.create_server(**body.dict()))
    except services.NameTaken as exc:
        return Status(409, {"code": "name_taken", "message": str(exc)})


@router.put(
    "/servers/{server_id}",
    response={200: ServerOut, 404: Problem, 409: Problem},
    summary="Change a server's endpoints, model, tenant or pull interval",
    description="Its name stays: request records name their server by it. 409: the server is proposed. "
    + STAFF_AUTH,
)
def update_server(request: HttpRequest, server_id: int, body: EndpointsIn) -> Any:
    return _changed(lambda: services.update_server(server_id=server_id, **body.dict()))


@router.post(
    "/servers/{server_id}/disable",
    response={200: ServerOut, 404: Problem, 409: Problem},
    summary="Disable a server: its pulls stop, its data stays",
    description=STAFF_AUTH,
)
def disable_server(request: HttpRequest, server_id: int) -> Any:
    return _changed(lambda: services.set_server_enabled(server_id=server_id, enabled=False))


@router.post(
    "/servers/{server_id}/enable",
    response={200: ServerOut, 404: Problem, 409: Problem},
    summary="Enable a disabled server again",
    description=STAFF_AUTH,
)
def enable_server(request: HttpRequest, server_id: int) -> Any:
    return _changed(lambda: services.set_server_enabled(server_id=server_id, enabled=True))


@router.post(
    "/servers/{server_id}/accept",
    response={200: ServerOut, 404: Problem, 409: Problem},
    summary="Accept a proposed server at its base URL",
    description="It becomes active and its pulls begin. 409: it is not proposed (any more). " + STAFF_AUTH,
)
def accept_server(request: HttpRequest, server_id: int, body: AcceptIn) -> Any:
    return _changed(lambda: services.accept_server(server_id=server_id, base_url=body.base_url))


@router.post(
    "/servers/{server_id}/merge",
    response={200: MergedOut, 404: Problem, 409: Problem},
    summary="Merge a proposed server into the registered one it stands for",
    description="Its request records move to that server and it is deleted. 409: it is not proposed, or "
    "`into` is. " + STAFF_AUTH,
)
def merge_proposed_server(request: HttpRequest, server_id: int, body: MergeIn) -> Any:
    return _changed(lambda: merge_server(server_id=server_id, into_id=body.into))


def _changed(change: Callable[[], object]) -> Any:
    """The change's result; 404 for a server that is not there, 409 for one in the wrong state."""
    try:
        return change()
    except services.ServerGone as exc:
        return Status(404, {"code": "not_found", "message": str(exc)})
    except services.ServerStateError as exc:
        return Status(409, {"code": "wrong_state", "message": str(exc)})
