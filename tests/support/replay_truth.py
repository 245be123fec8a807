"""Ground truth for the replay engine: a scenario's fleet served through the simulator's prefix caches,
and the trace of that run as the replay reads it. No database.

`serve` serves a scenario's definition as simulator/served_trace.py does (the prompts and routing of
`make run`, one simulator PrefixCache per server, a capacity cut or a restart an empty cache): what
each cache reused is the ground truth. The variants change a definition's capacity, routing or
timeline; `what_if` is the replay's question for one, `Check` a prediction against serving it. A
helper of tests/domain/test_replay_truth.py and bench/bench_replay_truth.py: nothing here is product
code.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from app.domain.replay.routing import Routing
from app.domain.replay.run import Setup, replay
from simulator.scenario import parse_scenario
from simulator.served_trace import ServedRun, scenario_setup, served_trace

DEMO = Path(__file__).resolve().parents[2] / "simulator" / "scenarios" / "demo.yaml"


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


def serve(definition: Mapping[str, Any], *, seed: int = 0, routing: Routing | None = None) -> ServedRun:
    """Plan the scenario with `seed` and serve it through the simulator's caches; the run's trace.
    `routing`: routed at serving by that policy (served_trace), not where the planner sent them."""
    return _serve(yaml.safe_dump(dict(definition)), seed, routing)


@cache
def _serve(definition: str, seed: int, routing: Routing | None) -> ServedRun:
    # Keyed by the definition's text: each variant is served once per process (tests and bench share).
    return served_trace(parse_scenario(yaml.safe_load(definition)), seed=seed, routing=routing)


def predict(run: ServedRun, setup: Setup) -> float:
    """The replay's hit rate for `run`'s trace under `setup`."""
    rate = replay(run.trace, setup).hit_rate
    assert rate is not None
    return rate


def what_if(definition: Mapping[str, Any], routing: Routing = Routing.RECORDED, *, seed: int = 0) -> Setup:
    """The replay's Setup for the fleet `definition` describes (its servers, block size, cuts and
    restarts), routed by `routing`: the question a what-if asks, not the answer of serving it."""
    return scenario_setup(parse_scenario(dict(definition)), routing, seed=seed)


@dataclass(frozen=True, slots=True)
class Check:
    """One prediction against the truth: the trace of the fleet `recorded` describes, replayed under
    `setup`, against the fleet `actual` describes, served. `tolerance` in hit-rate points."""

    name: str
    recorded: dict[str, Any]
    setup: Setup
    actual: dict[str, Any]
    tolerance: float = 3.0
    served_routing: Routing | None = None  # `actual` routed at serving by this policy

    def measure(self) -> tuple[float, float]:
        """(predicted, actual) hit rates, in points."""
        actual = serve(self.actual, routing=self.served_routing)
        return 100 * predict(serve(self.recorded), self.setup), 100 * actual.hit_rate


def checks() -> list[Check]:
    """Every check of the table: calibration (2 points), then capacity and routing (3 points).

    Capacity: every server's blocks changed, the demo's cut server keeping its 28. Routing: on the
    demo without its cut and restart as well, at the demo's 256 blocks and at 64, where eviction
    matters. The planner's prefix_aware router is template and tenant affinity, the replay's
    SESSION. The replay's PREFIX_AWARE (llm-d's: longest resident prefix, load cap) needs the
    caches at each arrival, which no planner has: that fleet is served with the router choosing
    over the simulator's caches as they are (served_trace's `routing`).
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
    for routing in (Routing.RANDOM, Routing.ROUND_ROBIN):  # the cut and the restart replayed as well
        routed = variant(demo, routing=routing.value)
        found.append(
            Check(f"demo with its cut: affinity -> {routing}", demo, what_if(routed, routing), routed)
        )
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
        aware = what_if(flat, Routing.PREFIX_AWARE)
        for name, recorded in (("affinity", flat), ("random", flat_random)):
            found.append(
                Check(f"{blocks} blocks: {name} -> llm-d prefix-aware", recorded, aware, flat,
                      served_routing=Routing.PREFIX_AWARE)
            )  # fmt: skip
    aware = what_if(demo, Routing.PREFIX_AWARE)
    found.append(
        Check("demo with its cut: affinity -> llm-d prefix-aware", demo, aware, demo,
              served_routing=Routing.PREFIX_AWARE)
    )  # fmt: skip
    return found
