"""A scenario served through the simulator's prefix caches, as a replay trace with what each request got.

The scenario's requests (simulator.planner, the prompts and routing of `make run`) go through one
simulator.cache.PrefixCache per server, one at a time as tests/support/virtual_fleet.py serves them,
with the timeline's capacity cuts and restarts applied at their time (a new, empty cache). Each
request becomes a TraceRequest with its token ids, the hashes the engine would report (sha256_cbor,
salted) and the cached tokens it got: the ground truth a replay of the same trace is checked against.
No git and no database: the template versions are the scenario's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

from app.domain import gpt2
from app.domain.blockhash import BlockHash, block_hash_chain
from app.domain.replay.routing import Router, Routing, ServerView
from app.domain.replay.run import Restart, ServerShape, Setup
from app.domain.replay.trace import Key, TraceRequest
from simulator.cache import PrefixCache
from simulator.planner import EPOCH, PlannedRequest, plan_requests
from simulator.scenario import CapacityCut, Scenario, ServerRestart
from simulator.template_repo import Commit, template_file, template_versions


def scenario_commits(scenario: Scenario) -> list[Commit]:
    """The scenario's template versions as the commits the planner reads, without a repository."""
    return [
        Commit(f"version-{n}", v.template, v.at, v.message, template_file(v.template), v.text)
        for n, v in enumerate(template_versions(scenario))
    ]


SERVER_PREFIX = "s"


def server_name(index: int) -> str:
    """The name a scenario's server `index` has in a served trace."""
    return f"{SERVER_PREFIX}{index}"


@dataclass(frozen=True, slots=True)
class ServedRun:
    """The served trace and the fleet as it ran: what a calibration replays it under."""

    trace: tuple[TraceRequest, ...]
    setup: Setup

    @property
    def hit_rate(self) -> float:
        """Cached over prompt tokens, as the engines reported them."""
        prompt = sum(r.prompt_tokens for r in self.trace)
        return sum(r.cached_tokens or 0 for r in self.trace) / prompt if prompt else 0.0


def scenario_setup(scenario: Scenario, routing: Routing = Routing.RECORDED, *, seed: int = 0) -> Setup:
    """The replay's setup of the fleet a scenario describes: its servers, block size and timeline
    (a capacity cut or a restart: the server started anew, with the blocks it then has)."""
    blocks = [scenario.servers.num_blocks] * scenario.servers.count
    restarts = []
    for event in scenario.timeline:
        if isinstance(event, CapacityCut | ServerRestart):
            if isinstance(event, CapacityCut):
                blocks[event.server] = event.num_blocks
            restarts.append(Restart(event.at, server_name(event.server), blocks[event.server]))
    servers = tuple(
        ServerShape(server_name(n), scenario.servers.num_blocks) for n in range(scenario.servers.count)
    )
    return Setup(servers, scenario.servers.block_size, routing, restarts=tuple(restarts), seed=seed)


def served_trace(scenario: Scenario, *, seed: int = 0, routing: Routing | None = None) -> ServedRun:
    """Every planned request of the scenario, served, in arrival order, with the fleet's setup.
    `routing`: each request served where the replay's router of that policy sends it, looking at
    the caches as they are then (what each holds of its chain, its running requests), instead of
    where the planner sent it. Routing.PREFIX_AWARE is llm-d's precise prefix-cache routing, which
    no planner can do: it needs the servers' caches at the request's arrival."""
    setup = scenario_setup(scenario)
    block_size = scenario.servers.block_size
    caches = [PrefixCache(block_size, scenario.servers.num_blocks) for _ in range(scenario.servers.count)]
    router = None if routing is None else Router(routing, [s.name for s in setup.servers], seed=seed)
    restarts = list(setup.restarts)
    trace = []
    for request in plan_requests(scenario, scenario_commits(scenario), seed=seed, start=EPOCH):
        while restarts and restarts[0].at <= request.at:
            restart = restarts.pop(0)
            server = int(restart.server.removeprefix(SERVER_PREFIX))
            caches[server] = PrefixCache(block_size, restart.num_blocks)
        prompt = _Prompt.of(request, block_size)
        served = _traced(request, prompt, block_size)
        if router is not None:
            served = replace(served, server=server_name(router.choose(served, prompt.chain, _views(caches))))
        cache = caches[int(served.server.removeprefix(SERVER_PREFIX))]
        cached = cache.admit(request.request_id, prompt.tokens, cache_salt=prompt.salt).cached_tokens
        cache.finish(request.request_id)
        trace.append(replace(served, cached_tokens=cached))
    return ServedRun(tuple(trace), setup)


@dataclass(frozen=True, slots=True)
class _Prompt:
    """A planned request's prompt as the engine takes it: its token ids, salt and block chain."""

    tokens: list[int]
    salt: str | None
    chain: tuple[BlockHash, ...]

    @classmethod
    def of(cls, request: PlannedRequest, block_size: int) -> _Prompt:
        body = request.body
        text = gpt2.render_chat(body["messages"]) if "messages" in body else str(body["prompt"])  # type: ignore[arg-type]
        tokens = gpt2.encode(text)
        salt = body.get("cache_salt")
        salt = salt if isinstance(salt, str) else None
        return cls(tokens, salt, tuple(block_hash_chain(tokens, block_size, cache_salt=salt)))


class _CacheView(ServerView):
    """What the router reads of one server: its cache, as a prefix-aware router reads it."""

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache

    def load(self) -> int:
        return self.cache.running

    def resident(self, keys: Sequence[Key]) -> int:
        return self.cache.resident(cast(Sequence[BlockHash], keys))


def _views(caches: Sequence[PrefixCache]) -> list[ServerView]:
    return [_CacheView(cache) for cache in caches]


def _traced(request: PlannedRequest, prompt: _Prompt, block_size: int) -> TraceRequest:
    """The request as its trace has it, on the server the planner chose, its reuse not yet known."""
    unsalted = tuple(h.wire for h in block_hash_chain(prompt.tokens, block_size)) if prompt.salt else ()
    return TraceRequest(
        request_id=request.request_id,
        arrived=request.at,
        prompt_tokens=len(prompt.tokens),
        server=server_name(request.server),
        salt=prompt.salt or "",
        tenant=request.tenant,
        template=request.template,
        block_size=block_size,
        block_hashes=tuple(h.wire for h in prompt.chain),
        unsalted_hashes=unsalted,
        token_ids=tuple(prompt.tokens),
    )


def with_duration(scenario: Scenario, duration: float) -> Scenario:
    """The scenario run for `duration` virtual seconds (its timeline cut to it)."""
    return replace(
        scenario, duration=duration, timeline=tuple(e for e in scenario.timeline if e.at < duration)
    )
