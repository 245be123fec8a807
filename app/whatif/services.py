"""Asking what another configuration would reuse: a scope and a window of the fleet's records, replayed.

A scope is the fleet, a server group, or a template. Every request of the scope's servers in the
window is replayed (all compete for the same blocks); the answers count the scope's requests the
viewer may see. Servers that had more KV blocks in the day before the window's end than they have
now (a capacity cut, a restart with other flags) are also answered as given them back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from app.core.tenancy import SEES_ALL, Viewer
from app.diagnosis.cost import configured_pricing, prefill_sums
from app.domain.cost import prefill_rate
from app.domain.replay.trace import TraceRequest
from app.domain.replay.whatif import Price, Progress, WhatIf, what_if
from app.fleet.models import Server
from app.prompts.models import Template
from app.traffic.kv_blocks import kv_blocks_seen
from app.traffic.models import RequestRecord
from app.whatif.trace import WindowTrace, window_trace

RESTORE_LOOKBACK = timedelta(days=1)
"""How far back a server's larger KV capacity is remembered, to answer giving it back."""


class ScopeKind(StrEnum):
    FLEET = "fleet"
    GROUP = "group"
    TEMPLATE = "template"


@dataclass(frozen=True, slots=True)
class Scope:
    kind: ScopeKind
    name: str = ""  # the group's or template's; '' for the fleet

    def __str__(self) -> str:
        return "the fleet" if self.kind is ScopeKind.FLEET else f"{self.kind} {self.name}"


class NothingToReplay(Exception):
    """The scope names nothing the viewer sees, or has no replayable request in the window."""


@dataclass(frozen=True, slots=True)
class Asked:
    """A what-if's answers with what was replayed to give them."""

    scope: Scope
    since: datetime
    until: datetime
    answers: WhatIf
    unknown_prompt: int  # records left out: no prompt token count
    left_out_servers: tuple[str, ...]  # of another block size, or of unknown size


def ask(*, scope: Scope, since: datetime, until: datetime, viewer: Viewer = SEES_ALL,
        progress: Progress | None = None) -> Asked:  # fmt: skip
    """Replay the scope's window and answer every alternative. Raises NothingToReplay when the
    scope is unknown to the viewer or no request of it can be replayed in the window."""
    servers = _servers(scope, since=since, until=until, viewer=viewer)
    trace = window_trace(servers=servers, since=since, until=until)
    counted = _counted(scope, viewer, since=trace.counted_from)
    if not any(counted(request) for request in trace.requests):
        unknown = f" (KV blocks unknown: {', '.join(trace.unsized)})" if trace.unsized else ""
        raise NothingToReplay(f"no request of {scope} to replay in the window{unknown}")
    answers = what_if(
        trace.requests,
        servers=trace.servers,
        block_size=trace.block_size,
        window_seconds=(until - since).total_seconds(),
        price=_price(scope, since=since, until=until, viewer=viewer),
        counted=counted,
        restarts=trace.restarts,
        restore=_restore(servers, trace, until=until),
        uncompared=trace.unwired,
        progress=progress,
    )
    return Asked(scope, since, until, answers, trace.unknown_prompt, trace.unsized)


def scope_visible(scope: Scope, viewer: Viewer) -> bool:
    """Whether the viewer sees the scope: the fleet always; a group of a server it sees; a template it
    sees (another tenant's reads as a missing one: a 404 on the page, a 400 from the API)."""
    if scope.kind is ScopeKind.GROUP:
        return viewer.servers(Server.objects.filter(group=scope.name)).exists()
    if scope.kind is ScopeKind.TEMPLATE:
        return viewer.templates(Template.objects.filter(name=scope.name)).exists()
    return True


def _servers(scope: Scope, *, since: datetime, until: datetime, viewer: Viewer) -> list[Server]:
    """The servers whose requests are replayed: the fleet's, the group's, or those that served the
    template in the window (with every other request they served)."""
    servers = viewer.servers(Server.objects.all()).order_by("name")
    if scope.kind is ScopeKind.GROUP:
        servers = servers.filter(group=scope.name)
    elif scope.kind is ScopeKind.TEMPLATE:
        template = viewer.templates(Template.objects.filter(name=scope.name)).first()
        if template is None:
            raise NothingToReplay(f"no template {scope.name!r}")
        served = RequestRecord.objects.filter(template=template, arrived_at__gte=since, arrived_at__lt=until)
        servers = servers.filter(pk__in=served.values("server_id").distinct())
    found = list(servers)
    if not found:
        raise NothingToReplay(f"no server of {scope}")
    return found


def _counted(scope: Scope, viewer: Viewer, *, since: float) -> Callable[[TraceRequest], bool]:
    """Which replayed requests the answers are about: the window's (not the warm-up's), the
    template's (for its scope), of the tenants the viewer sees."""

    def counted(request: TraceRequest) -> bool:
        if request.arrived < since:
            return False
        if scope.kind is ScopeKind.TEMPLATE and request.template != scope.name:
            return False
        return viewer.sees_all or viewer.sees_tenant(request.tenant)

    return counted


def _price(scope: Scope, *, since: datetime, until: datetime, viewer: Viewer) -> Price:
    """The scope's measured prefill rate (the template's for a template), else the configured one."""
    template_id = None
    if scope.kind is ScopeKind.TEMPLATE:
        template_id = Template.objects.filter(name=scope.name).values_list("pk", flat=True).first()
    pricing = configured_pricing()
    rate = prefill_rate(
        prefill_sums(since=since, until=until, template_id=template_id, viewer=viewer), pricing
    )
    return Price(rate.tokens_per_second, pricing.gpu_hour_price, rate.source)


def _restore(servers: list[Server], trace: WindowTrace, *, until: datetime) -> dict[str, int]:
    """The most KV blocks each replayed server had in the day before `until`, where more than now."""
    now = {shape.name: shape.num_blocks for shape in trace.servers}
    for restart in trace.restarts:  # the fewest it had in the window
        now[restart.server] = min(now[restart.server], restart.num_blocks)
    restore = {}
    for server in servers:
        seen = kv_blocks_seen(server, since=until - RESTORE_LOOKBACK, until=until)
        if server.name in now and seen and max(seen) > now[server.name]:
            restore[server.name] = max(seen)
    return restore


MAX_WINDOW = timedelta(hours=24)
"""The longest window asked (the page, the API, the command): every request of it is held in memory
and replayed some thirty times."""


def window_problem(since: datetime, until: datetime) -> str | None:
    """What is wrong with a window asked (of the page, the API or the command), None when nothing is."""
    if until <= since:
        return "the window must end after it starts"
    if until - since > MAX_WINDOW:
        return f"the window is longer than {MAX_WINDOW.total_seconds() / 3600:g} hours"
    return None
