"""The traffic plan of a scenario: every request, when it is sent, to which server, with which body.

``plan_requests`` is pure: from a scenario, its template commits and a seed it yields every request
(time, server, tenant, template version, endpoint, JSON body, headers), the same ones for the same
seed. ``simulator.loadgen`` sends the plan to the servers.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import jinja2

from simulator.part_changes import part_change_steps
from simulator.scenario import Routing, RoutingChange, SaltChange, Scenario, Template, Tenant
from simulator.scenario_side import Conversation
from simulator.template_rendering import request_variables, template_environment
from simulator.template_repo import Commit, version_at

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""The default wall-clock time of virtual second 0, for the ``now`` a template renders."""
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a scenario. ``at`` is virtual seconds; ``server`` indexes the base URLs.

    ``prompt`` is the rendered template: the completion prompt, or a chat request's system message.
    """

    index: int
    at: float
    server: int
    tenant: str
    template: str
    version: str
    request_id: str
    path: str
    body: dict[str, object]
    headers: dict[str, str]
    prompt: str

    @property
    def stream(self) -> bool:
        """Whether the answer comes as server-sent events."""
        return self.body.get("stream") is True


def plan_requests(
    scenario: Scenario, commits: Sequence[Commit], *, seed: int, start: datetime = EPOCH, run_id: str = ""
) -> Iterator[PlannedRequest]:
    """Yield the scenario's requests in time order; the same seed gives the same requests.

    Arrivals are a Poisson process at ``scenario.rate`` over ``[0, duration)``. Each request picks a
    template and a tenant by weight, a server by the routing policy, streams with probability
    ``stream_fraction``, and renders the template version live at its time (``version_at``) with
    fresh variables (``request_variables``); a tenant's salt follows the timeline's salt changes, and
    the routing policy its routing changes.
    ``start`` is the wall-clock time of virtual second 0 for the ``now`` variable. Request ids are
    ``<scenario>-<run_id>-<seed>-<index>`` (``<scenario>-<seed>-<index>`` without a ``run_id``): two
    runs with the same seed repeat their ids unless their run ids differ, and a client that sends
    one id for two requests is what the product must tell apart, not what a demo should show.
    Raises ValueError when a template has no commit at a request's time.
    """
    planner = _Planner(scenario, commits, seed, start, run_id)
    rng = planner.rng
    at = rng.expovariate(scenario.rate)
    index = 0
    while at < scenario.duration:
        yield planner.plan(index, at)
        index += 1
        at += rng.expovariate(scenario.rate)


def plan_side_requests(
    scenario: Scenario, commits: Sequence[Commit], *, seed: int, start: datetime = EPOCH, run_id: str = ""
) -> list[PlannedRequest]:
    """The side servers' own requests and the conversations' (simulator/scenario_side.py), in time
    order; the same seed gives the same requests, and ``plan_requests``' are not changed by them.

    A side server's requests are planned as the routed ones are (Poisson at its ``rate``, templates
    and tenants by weight, the timeline's template versions and salts), each with a random stream of
    its own; their ids are ``<plan_requests' prefix>-s<server>-<index>``, a conversation's
    ``...-c<server>-<index>``.
    """
    planned: list[PlannedRequest] = []
    for side in scenario.side_servers:
        planner = _Planner(scenario, commits, seed, start, run_id, pinned=side.server)
        at, index = planner.rng.expovariate(side.rate) if side.rate else scenario.duration, 0
        while at < scenario.duration:
            planned.append(planner.plan(index, at))
            index += 1
            at += planner.rng.expovariate(side.rate)
    prefix = _id_prefix(scenario, seed, run_id)
    for conversation in scenario.conversations:
        planned += _conversation(scenario, conversation, seed, prefix)
    return sorted(planned, key=lambda request: request.at)


def _id_prefix(scenario: Scenario, seed: int, run_id: str) -> str:
    return "-".join(part for part in (scenario.name, run_id, str(seed)) if part)


def _conversation(
    scenario: Scenario, conversation: Conversation, seed: int, prefix: str
) -> list[PlannedRequest]:
    steps = part_change_steps(
        per_phase=conversation.per_phase, model=scenario.model, adapter=conversation.adapter or "",
        seed=seed, phases=("base", *conversation.changes),
    )  # fmt: skip
    planned = []
    for index, step in enumerate(steps):
        at = conversation.start + index * conversation.every
        if at >= scenario.duration:
            break
        request_id = f"{prefix}-c{conversation.server}-{index:06d}"
        headers = {"X-Prefixscope-Template": conversation.template, "X-Request-Id": request_id}
        planned.append(
            PlannedRequest(
                index=index, at=at, server=conversation.server, tenant="", template=conversation.template,
                version="", request_id=request_id, path=CHAT_PATH, body=step.body, headers=headers, prompt="",
            )
        )  # fmt: skip
    return planned


class _Router:
    """Chooses servers. prefix_aware: the server that last served the same template and tenant, else
    the one with the fewest requests so far (ties: the lowest index). Whatever the policy, it keeps
    where each template and tenant went last, so a switch back to prefix_aware keeps them there."""

    def __init__(self, scenario: Scenario) -> None:
        self.policy: Routing = scenario.routing
        self.assigned = [0] * scenario.servers.count
        self.last: dict[tuple[str, str], int] = {}

    def choose(self, template: str, tenant: str, rng: random.Random) -> int:
        """The server for the next request; ``rng`` is used by the random policy only."""
        count = len(self.assigned)
        if self.policy == "random":
            server = rng.randrange(count)
        elif self.policy == "round_robin":
            server = sum(self.assigned) % count
        else:
            least_loaded = min(range(count), key=lambda s: self.assigned[s])
            server = self.last.get((template, tenant), least_loaded)
        self.last[(template, tenant)] = server
        self.assigned[server] += 1
        return server


class _Planner:
    """The state of one planning pass: rng, routing memory, tenants' current salts, compiled templates."""

    def __init__(
        self,
        scenario: Scenario,
        commits: Sequence[Commit],
        seed: int,
        start: datetime,
        run_id: str,
        *,
        pinned: int | None = None,
    ) -> None:
        self.scenario = scenario
        self.pinned = pinned  # a side server's number: every request goes there, no router
        self.id_prefix = _id_prefix(scenario, seed, run_id) + ("" if pinned is None else f"-s{pinned}")
        self.commits = commits
        self.texts = {commit.sha: commit.text for commit in commits}
        self.seed = seed
        self.start = start
        self.rng = random.Random(seed if pinned is None else f"{seed}-side-{pinned}")
        self.router = _Router(scenario)
        self.salts = {tenant.name: tenant.cache_salt for tenant in scenario.tenants}
        self.salt_changes = deque(e for e in scenario.timeline if isinstance(e, SaltChange))
        self.routing_changes = deque(e for e in scenario.timeline if isinstance(e, RoutingChange))
        self.environment = template_environment()
        self.compiled: dict[str, jinja2.Template] = {}

    def plan(self, index: int, at: float) -> PlannedRequest:
        """The request number ``index`` at virtual second ``at`` (calls come in time order)."""
        self._apply_salt_changes(at)
        self._apply_routing_changes(at)
        template, tenant = self._pick()
        server = (
            self.router.choose(template.name, tenant.name, self.rng) if self.pinned is None else self.pinned
        )
        stream = self.rng.random() < self.scenario.stream_fraction
        request_id = f"{self.id_prefix}-{index:06d}"
        version = version_at(self.commits, template.name, at)
        if version is None:
            raise ValueError(f"template {template.name!r} has no commit at virtual second {at}")
        now = (self.start + timedelta(seconds=at)).isoformat(timespec="milliseconds")
        variables = request_variables(
            template, now=now, request_id=request_id, tenant=tenant.name, rng=self.rng
        )
        prompt = self._compile(version).render(variables)
        return PlannedRequest(
            index=index,
            at=at,
            server=server,
            tenant=tenant.name,
            template=template.name,
            version=version,
            request_id=request_id,
            path=CHAT_PATH if template.kind == "chat" else COMPLETIONS_PATH,
            body=self._body(template, prompt, str(variables["question"]), self.salts[tenant.name], stream),
            headers=_headers(template.name, version, tenant.name, request_id),
            prompt=prompt,
        )

    def _apply_salt_changes(self, at: float) -> None:
        """Give the tenants the salts the timeline sets up to virtual second ``at``."""
        while self.salt_changes and self.salt_changes[0].at <= at:
            change = self.salt_changes.popleft()
            self.salts[change.tenant] = change.cache_salt

    def _apply_routing_changes(self, at: float) -> None:
        """Switch the router to the policy the timeline sets up to virtual second ``at``."""
        while self.routing_changes and self.routing_changes[0].at <= at:
            self.router.policy = self.routing_changes.popleft().routing

    def _pick(self) -> tuple[Template, Tenant]:
        templates, tenants = self.scenario.templates, self.scenario.tenants
        template = self.rng.choices(templates, weights=[t.weight for t in templates])[0]
        tenant = self.rng.choices(tenants, weights=[t.weight for t in tenants])[0]
        return template, tenant

    def _compile(self, version: str) -> jinja2.Template:
        if version not in self.compiled:
            self.compiled[version] = self.environment.from_string(self.texts[version])
        return self.compiled[version]

    def _body(
        self, template: Template, prompt: str, question: str, salt: str | None, stream: bool
    ) -> dict[str, object]:
        body: dict[str, object] = {"model": self.scenario.model}
        if template.kind == "chat":
            body["messages"] = [{"role": "system", "content": prompt}, {"role": "user", "content": question}]
        else:
            body["prompt"] = prompt
        body["max_tokens"] = self.scenario.max_tokens
        body["return_token_ids"] = False  # token ids would multiply the answer size for nothing we read
        if salt is not None:
            body["cache_salt"] = salt
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # else a stream carries no usage at all
        return body


def _headers(template: str, version: str, tenant: str, request_id: str) -> dict[str, str]:
    return {
        "X-Prefixscope-Template": template,
        "X-Prefixscope-Template-Version": version,
        "X-Prefixscope-Tenant": tenant,
        "X-Request-Id": request_id,
    }
