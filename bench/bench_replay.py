"""How many requests a minute one core replays at the demo's prompt shapes, and what the what-if costs.

    .venv/bin/python -m bench replay [--copies 8]

The trace: the demo scenario (simulator/scenarios/demo.yaml: four templates of 300-430 tokens,
16-token blocks, four servers of 256 blocks, its capacity cut and restart) served through the
simulator (simulator/served_trace.py, untimed), repeated `--copies` times one after another (ids
and times shifted), so about 2,900 x copies requests. CPU seconds of this process (time.process_time),
the best of 3 rounds:
  replay point        the trace replayed as the fleet ran (recorded routing, its restarts)
  prefix-aware point  the same under the llm-d-style router (every server's resident prefix looked up)
  one-pass curve      the capacity curve at every size in one pass (app/domain/replay/curve.py)
  what-if             every answer of app/domain/replay/whatif.py (calibration, 8 capacities, the
                      one-pass curve, 7 routings, 4 server counts, 4 block sizes, salts, restore)
Baseline, in the same run: the simulator's own PrefixCache serving the same requests (their sha256
hash chains, the KV events it emits): what a replay avoids by reading the stored hashes.
Target: a replay point at >= 1,000,000 requests a minute on one core.
"""

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from app.domain.replay.curve import capacity_curve
from app.domain.replay.routing import Routing
from app.domain.replay.run import replay
from app.domain.replay.trace import TraceRequest
from app.domain.replay.whatif import Price, what_if
from bench.harness import print_baseline, print_figure, verdict
from simulator.cache import PrefixCache
from simulator.scenario import load_scenario, resolve_scenario
from simulator.served_trace import ServedRun, served_trace

ROUNDS = 3
TARGET_PER_MINUTE = 1_000_000


def repeated(run: ServedRun, copies: int) -> list[TraceRequest]:
    """The trace `copies` times in a row, each copy's ids and times its own."""
    span = max(r.arrived for r in run.trace) + 1
    return [
        replace(r, request_id=f"{r.request_id}-{copy}", arrived=r.arrived + copy * span)
        for copy in range(copies)
        for r in run.trace
    ]


def cpu_seconds(work: Callable[[], object]) -> float:
    """The least CPU time of ROUNDS runs of `work`."""
    spent = []
    for _ in range(ROUNDS):
        started = time.process_time()
        work()
        spent.append(time.process_time() - started)
    return min(spent)


def simulate(trace: Sequence[TraceRequest], block_size: int, num_blocks: int) -> None:
    """The baseline: the simulator's caches serve the same prompts (hashing them, emitting events)."""
    caches: dict[str, PrefixCache] = {}
    for request in trace:
        cache = caches.setdefault(request.server, PrefixCache(block_size, num_blocks))
        cache.admit(request.request_id, request.token_ids or (), cache_salt=request.salt or None)
        cache.finish(request.request_id)
        cache.take_events()


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--copies", type=int, default=8)
    args = parser.parse_args(argv)
    run = served_trace(load_scenario(resolve_scenario("demo")))
    trace = repeated(run, args.copies)
    setup = run.setup
    span = max(r.arrived for r in run.trace) + 1
    setup = replace(
        setup,
        restarts=tuple(replace(r, at=r.at + c * span) for c in range(args.copies) for r in setup.restarts),
    )
    count = len(trace)
    print(f"{count:,} requests of the demo's shapes, {sum(r.prompt_tokens for r in trace):,} prompt tokens")
    base = cpu_seconds(lambda: simulate(trace, setup.block_size, setup.servers[0].num_blocks))
    print_baseline("simulator caches serving the trace", count / base * 60, "requests/min")
    point = cpu_seconds(lambda: replay(trace, setup))
    per_minute = count / point * 60
    note = f"{verdict(per_minute >= TARGET_PER_MINUTE)} (target {TARGET_PER_MINUTE:,})"
    print_figure("replay point, as the fleet ran", per_minute, "requests/min", count / base * 60, note)
    aware = cpu_seconds(lambda: replay(trace, replace(setup, routing=Routing.PREFIX_AWARE)))
    print_figure("replay point, prefix-aware routing", count / aware * 60, "requests/min", count / base * 60)
    curve = cpu_seconds(lambda: capacity_curve(trace, block_size=setup.block_size))
    print_figure(
        "one-pass capacity curve (every size)", count / curve * 60, "requests/min", count / base * 60
    )
    whole = cpu_seconds(
        lambda: what_if(
            trace, servers=setup.servers, block_size=setup.block_size, window_seconds=span * args.copies,
            price=Price(8000, 2.5), restarts=setup.restarts,
        )
    )  # fmt: skip
    print_figure("what-if, every answer", whole, "CPU s", base, f"{count:,} requests")
