"""Ground truth for the replay engine: a scenario's fleet served through the simulator's prefix caches,
and the trace of that run as the replay reads it. No database.

`serve` plans a scenario (simulator.planner, the prompts and routing of `make run`) and serves every
request through one simulator.cache.PrefixCache per server at its virtual time, as
tests/support/virtual_fleet.py does (a capacity cut or a restart of the timeline is a new process
with an empty cache). What each cache reused is the ground truth; the run's trace carries each
request's server, salt, tenant, template, token ids, the engine's block hashes (sha256_cbor wire
hashes, app.domain.blockhash) and cached tokens.

A server process is one ServerShape: a capacity cut or a restart starts a new one (`s3.1` is server
3's second process), since a replay's servers keep their capacity for the whole trace. With
RECORDED routing that is exact; the other routings choose among the shapes, so they are compared
on a timeline without cuts and restarts (`without_restarts`). A helper of
tests/domain/test_replay_truth.py and bench/bench_replay_truth.py: nothing here is product code.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from app.domain import gpt2
from app.domain.blockhash import block_hash_chain
from app.domain.replay.routing import Routing
from app.domain.replay.run import ServerShape, Setup, replay
from app.domain.replay.trace import TraceRequest
from simulator.cache import PrefixCache
from simulator.planner import PlannedRequest, plan_requests
from simulator.scenario import CapacityCut, Scenario, ServerRestart, parse_scenario
from simulator.template_repo import Commit, template_versions

DEMO = Path(__file__).resolve().parents[2] / "simulator" / "scenarios" / "demo.yaml"


@dataclass(frozen=True, slots=True)
class ServedRun:
    """A scenario as the fleet served it: the trace (with what each request reused) and the fleet's
    server processes in the order they started."""

    trace: tuple[TraceRequest, ...]
    shapes: tuple[ServerShape, ...]
    block_size: int

    @property
    def hit_rate(self) -> float:
        """Cached over prompt tokens, as the engines reported them."""
        prompt = sum(r.prompt_tokens for r in self.trace)
        return sum(r.cached_tokens or 0 for r in self.trace) / prompt

    def setup(self, routing: Routing = Routing.RECORDED, *, seed: int = 0) -> Setup:
        """The replay's Setup of this fleet as it ran."""
        return Setup(self.shapes, self.block_size, routing, seed=seed)


def demo_definition() -> dict[str, Any]:
    """The demo scenario's definition, a fresh copy each call (variants change it)."""
    return copy.deepcopy(_demo())


@cache
def _demo() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    return loaded


def variant(
    definition: Mapping[str, Any], *, num_blocks: int | None = None, routing: str | None = None
) -> dict[str, Any]:
    """`definition` with every server's KV blocks (the timeline's cut kept) or the routing changed."""
    changed = copy.deepcopy(dict(definition))
    if num_blocks is not None:
        changed["servers"]["num_blocks"] = num_blocks
    if routing is not None:
        changed["routing"] = routing
    return changed


def without_restarts(definition: Mapping[str, Any]) -> dict[str, Any]:
    """`definition` without the timeline's capacity cuts and restarts: four servers for the whole run."""
    changed = copy.deepcopy(dict(definition))
    changed["timeline"] = [
        e for e in changed.get("timeline", []) if "capacity_cut" not in e and "server_restart" not in e
    ]
    return changed


def restore_cut(definition: Mapping[str, Any]) -> dict[str, Any]:
    """`definition` with each capacity cut made a restart at the same time: the blocks restored."""
    changed = copy.deepcopy(dict(definition))
    changed["timeline"] = [
        {"at": e["at"], "server_restart": {"server": e["capacity_cut"]["server"]}}
        if "capacity_cut" in e
        else e
        for e in changed.get("timeline", [])
    ]
    return changed


def fleet_shapes(scenario: Scenario) -> tuple[ServerShape, ...]:
    """The server processes a scenario runs, in the order they start: each server's first, then
    one per capacity cut or restart (a restart keeps the blocks the server had)."""
    blocks = [scenario.servers.num_blocks] * scenario.servers.count
    epochs = [0] * scenario.servers.count
    shapes = [ServerShape(_name(s, 0), blocks[s]) for s in range(scenario.servers.count)]
    for event in scenario.timeline:
        if isinstance(event, CapacityCut | ServerRestart):
            server = event.server
            epochs[server] += 1
            if isinstance(event, CapacityCut):
                blocks[server] = event.num_blocks
            shapes.append(ServerShape(_name(server, epochs[server]), blocks[server]))
    return tuple(shapes)


def serve(definition: Mapping[str, Any], *, seed: int = 0) -> ServedRun:
    """Plan the scenario with `seed` and serve it through the simulator's caches; the run's trace."""
    return _serve(yaml.safe_dump(dict(definition)), seed)


@cache
def _serve(definition: str, seed: int) -> ServedRun:
    # Keyed by the definition's text: each variant is served once per process (tests and bench share).
    scenario = parse_scenario(yaml.safe_load(definition))
    commits = [
        Commit(sha=f"v{i}", template=v.template, time=v.at, message=v.message, path="", text=v.text)
        for i, v in enumerate(template_versions(scenario))
    ]
    fleet = _Fleet(scenario)
    trace = tuple(fleet.serve(planned) for planned in plan_requests(scenario, commits, seed=seed))
    return ServedRun(trace, fleet_shapes(scenario), scenario.servers.block_size)


def predict(run: ServedRun, setup: Setup) -> float:
    """The replay's hit rate for `run`'s trace under `setup`."""
    rate = replay(run.trace, setup).hit_rate
    assert rate is not None
    return rate


def what_if(definition: Mapping[str, Any], routing: Routing = Routing.RECORDED, *, seed: int = 0) -> Setup:
    """The replay's Setup for the fleet `definition` describes (its server processes, its block
    size), routed by `routing`: the question a what-if asks, not the answer of serving it."""
    scenario = parse_scenario(dict(definition))
    return Setup(fleet_shapes(scenario), scenario.servers.block_size, routing, seed=seed)


def _name(server: int, epoch: int) -> str:
    return f"s{server}" if epoch == 0 else f"s{server}.{epoch}"


class _Fleet:
    """Each server's current cache and process, the timeline applied as requests reach it."""

    def __init__(self, scenario: Scenario) -> None:
        size, blocks = scenario.servers.block_size, scenario.servers.num_blocks
        self.caches = [PrefixCache(size, blocks) for _ in range(scenario.servers.count)]
        self.epochs = [0] * scenario.servers.count
        self.timeline = [e for e in scenario.timeline if isinstance(e, CapacityCut | ServerRestart)]

    def serve(self, request: PlannedRequest) -> TraceRequest:
        """Serve one request (prefill, then released at once, as virtual_fleet does); its trace entry."""
        self._apply_timeline(request.at)
        body = request.body
        messages = body.get("messages")
        text = gpt2.render_chat(messages) if isinstance(messages, list) else str(body["prompt"])
        tokens = gpt2.encode(text)
        salt = body.get("cache_salt")
        salt = salt if isinstance(salt, str) else None
        cache = self.caches[request.server]
        admission = cache.admit(request.request_id, tokens, cache_salt=salt)
        cache.finish(request.request_id)
        hashes = block_hash_chain(tokens, cache.block_size, cache_salt=salt)
        return TraceRequest(
            request_id=request.request_id,
            arrived=request.at,
            prompt_tokens=len(tokens),
            server=_name(request.server, self.epochs[request.server]),
            salt=salt or "",
            tenant=request.tenant,
            template=request.template,
            block_size=cache.block_size,
            block_hashes=tuple(h.wire for h in hashes),
            token_ids=tuple(tokens),
            cached_tokens=admission.cached_tokens,
        )

    def _apply_timeline(self, at: float) -> None:
        while self.timeline and self.timeline[0].at <= at:
            event = self.timeline.pop(0)
            cache = self.caches[event.server]
            blocks = event.num_blocks if isinstance(event, CapacityCut) else cache.num_blocks
            self.caches[event.server] = PrefixCache(cache.block_size, blocks)
            self.epochs[event.server] += 1


@dataclass(frozen=True, slots=True)
class Check:
    """One prediction against the truth: the trace of the fleet `recorded` describes, replayed under
    `setup`, against the fleet `actual` describes, served. `tolerance` in hit-rate points."""

    name: str
    recorded: dict[str, Any]
    setup: Setup
    actual: dict[str, Any]
    tolerance: float = 3.0

    def measure(self) -> tuple[float, float]:
        """(predicted, actual) hit rates, in points."""
        return 100 * predict(serve(self.recorded), self.setup), 100 * serve(self.actual).hit_rate


def checks() -> list[Check]:
    """Every check of the table: calibration (2 points), then capacity and routing (3 points).

    Capacity: every server's blocks changed, the demo's cut server keeping its 28. Routing: on the
    demo without its cut and restart (a replay's servers are fixed for a trace), at the demo's 256
    blocks and at 64, where eviction matters. The planner's prefix_aware router is template and
    tenant affinity, the replay's SESSION; the replay's PREFIX_AWARE (llm-d's: longest resident
    prefix, load cap) has no served counterpart and is compared with the planner's as a different
    router, not as a prediction (bench_replay_truth lists it; the tests say how far apart they are).
    """
    demo = demo_definition()
    random = variant(demo, routing="random")
    found = [
        Check("calibration: demo as recorded", demo, what_if(demo), demo, 2.0),
        Check("calibration: demo routed randomly", random, what_if(random), random, 2.0),
    ]
    for blocks in (64, 1024):
        for name, definition in (("demo", demo), ("random-routed demo", random)):
            bigger = variant(definition, num_blocks=blocks)
            found.append(Check(f"{name} at {blocks} blocks", definition, what_if(bigger), bigger))
    found.append(Check("demo with its cut restored", demo, what_if(restore_cut(demo)), restore_cut(demo)))
    for blocks in (256, 64):
        flat = variant(without_restarts(demo), num_blocks=blocks)
        flat_random = variant(flat, routing="random")
        for routing in (Routing.RANDOM, Routing.ROUND_ROBIN):
            routed = variant(flat, routing=routing.value)
            found.append(
                Check(f"{blocks} blocks: affinity -> {routing}", flat, what_if(routed, routing), routed)
            )
        found.append(
            Check(f"{blocks} blocks: random -> session", flat_random, what_if(flat, Routing.SESSION), flat)
        )
    return found


def router_comparisons() -> list[Check]:
    """llm-d-style PREFIX_AWARE replayed against the planner's affinity router served: two routers
    (no tolerance: these are not predictions)."""
    demo = demo_definition()
    found = []
    for blocks in (256, 64):
        flat = variant(without_restarts(demo), num_blocks=blocks)
        aware = what_if(flat, Routing.PREFIX_AWARE)
        found.append(Check(f"{blocks} blocks: affinity -> llm-d prefix-aware", flat, aware, flat, 0.0))
        random = variant(flat, routing="random")
        found.append(Check(f"{blocks} blocks: random -> llm-d prefix-aware", random, aware, flat, 0.0))
    return found
