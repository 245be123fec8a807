"""Regression detection against what the simulator injected: delay per fault, and false regressions.

    DATABASE_URL=postgres://... .venv/bin/python -m bench regressions [--seeds 20] [--quiet-hours 5] \
        [--scenarios demo,routing,sequence] [--no-baseline]

Runs in a throw-away database on the server DATABASE_URL names. Each seed's demo scenario
(simulator/scenarios/demo.yaml: 25 virtual minutes, 4 servers, its timeline of faults) is stored as a
deployment stores it and diagnosed minute by minute (tests/support/virtual_fleet.py), the detection
(app.regressions.services.detect_regressions) run after each minute, as beat runs it. The deploy check
(app/regressions/deploys.py) runs every 15 virtual seconds between them, as beat runs it (not with
the baseline's second pass, the per-minute search alone, skipped by --no-baseline; each fault's
median delay is printed with its ratio to the baseline's). For each fault that should open a
regression (the `volatile_top` commit on `support`, the `unsorted_tools` commit on `agent`, the capacity
cut on server 3) it prints the detection delay in virtual seconds after the fault (a template fault's:
after the first request on its version), in detection cycles (runs) after the 50th request of its scope
arrived, whether the suspect commit was the injected one (for the others: whether the kind was), and
every regression that matches no fault (misattributions). The routing scenario, run for the same seeds,
is the demo's templates and tenants on servers of 64 blocks (room for the prefixes prefix-aware routing
sends each, not for all of them) whose router switches to round-robin at minute 10: a routing regression
of the fleet.
Then --quiet-hours seeds of a fault-free hour whose traffic swings tenfold (2 requests/s, then 0.2,
by turns of ten minutes) and stops for five minutes every twenty: the regressions they open (target:
none). The sequence scenario: a bad deploy on `support`, its revert, a second bad deploy three
minutes later and its revert (two regressions, each with its own suspect). Targets (issue 22): every
template fault found at most 90 s after the first request on its version, with the injected commit
as suspect; no false regression.
"""

import argparse
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from django.db import connection

from app.regressions.models import Regression
from app.regressions.services import check_deploys, detect_regressions
from app.traffic.models import KVEvent
from bench.harness import print_figure, throwaway_database
from simulator.planner import PlannedRequest
from simulator.scenario import resolve_scenario
from tests.support.virtual_fleet import VirtualRun, run_virtually

EVIDENCE = 50  # requests of the fault's scope after it, before anything may open
MIN_EVICTED_BLOCKS = 50  # in the five minutes after a cut: fewer, and it evicted next to nothing


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    at: float  # virtual seconds
    scope: str
    template: str | None = None  # a template fault's template (its commit is the suspect)
    server: int | None = None  # a capacity cut's server
    kind: str = Regression.Kind.TEMPLATE_COMMIT


FAULTS = [
    Fault("volatile_top", 300, "template", template="support"),
    Fault("unsorted_tools", 780, "template", template="agent"),
    Fault("capacity_cut", 960, "server", server=3, kind=Regression.Kind.CAPACITY),
]
ROUTING_FAULTS = [Fault("routing_change", 600, "fleet", kind=Regression.Kind.ROUTING)]


def demo() -> dict[str, Any]:
    with resolve_scenario("demo").open() as file:
        found: dict[str, Any] = yaml.safe_load(file)
    return found


def routing() -> dict[str, Any]:
    """The demo's templates and tenants on tight servers, their router changed at minute 10."""
    found = demo()
    timeline = [{"at": ROUTING_FAULTS[0].at, "routing_change": {"routing": "round_robin"}}]
    return found | {"duration": 900, "servers": found["servers"] | {"num_blocks": 64}, "timeline": timeline}


SUPPORT_TEXT = next(t["text"] for t in demo()["templates"] if t["name"] == "support")
SEQUENCE_FAULTS = [
    Fault("volatile_top", 300, "template", template="support"),
    Fault("shuffled_chunks", 660, "template", template="support"),
]


def sequence() -> dict[str, Any]:
    """A bad deploy, its revert, a second bad deploy three minutes later, and its revert."""
    revert = {"template": "support", "change": {"message": "Revert", "text": SUPPORT_TEXT}}
    timeline = [
        {"at": 300, "template": "support", "change": {"fault": "volatile_top"}},
        revert | {"at": 480},
        {"at": 660, "template": "support", "change": {"fault": "shuffled_chunks"}},
        revert | {"at": 840},
    ]
    return demo() | {"duration": 1020, "timeline": timeline}


SCENARIOS = {
    "demo": (demo, FAULTS),
    "routing": (routing, ROUTING_FAULTS),
    "sequence": (sequence, SEQUENCE_FAULTS),
}


def clear() -> None:
    with connection.cursor() as cursor:
        tables = ", ".join(connection.introspection.django_table_names(only_existing=True))
        cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")


def detected(
    definition: dict[str, Any],
    seed: int,
    keep: Callable[[PlannedRequest], bool] | None = None,
    *,
    deploy_check: bool = True,
) -> VirtualRun:
    """The scenario run with the detection each minute and, unless `deploy_check` is off (the
    baseline: the per-minute search alone), the deploy check every CHECK_SECONDS, as beat runs them."""
    clear()
    with tempfile.TemporaryDirectory() as folder:
        return run_virtually(
            definition,
            Path(folder),
            seed=seed,
            keep=keep,
            every_minute=lambda now: detect_regressions(now=now),
            every_check=(lambda now: check_deploys(now=now)) if deploy_check else None,
        )


def _matches(regression: Regression, fault: Fault, run: VirtualRun) -> bool:
    if regression.scope != fault.scope or abs(regression.changed_at - run.at(fault.at)) > timedelta(
        minutes=2
    ):
        return False
    if fault.template is not None:
        return regression.template is not None and regression.template.name == fault.template
    if fault.server is None:  # the fleet's
        return True
    return regression.server_id == run.servers[fault.server].pk


def _evicted_after(run: VirtualRun, fault: Fault) -> int:
    """Blocks the fault's server removed (its own KV events, what the engine did) in the five minutes
    after a capacity cut: a cut leaving room for all its prefixes, or for a server whose only
    template's prompts all change already, takes nothing, and there is nothing to find."""
    at = run.at(fault.at)
    removed = KVEvent.objects.filter(
        server=run.servers[fault.server or 0], kind=KVEvent.Kind.REMOVED, emitted_at__gte=at,
        emitted_at__lt=at + timedelta(minutes=5),
    )  # fmt: skip
    return removed.count()


def _in_scope(request: PlannedRequest, fault: Fault) -> bool:
    if fault.template:
        return request.template == fault.template
    return fault.server is None or request.server == fault.server


def fault_rows(
    run: VirtualRun, seed: int, faults: list[Fault]
) -> tuple[list[dict[str, Any]], list[Regression]]:
    regressions = list(Regression.objects.select_related("template", "suspect_version"))
    rows, matched = [], set()
    for fault in faults:
        found = next((r for r in regressions if _matches(r, fault, run)), None)
        after = [r for r in run.planned if r.at >= fault.at and _in_scope(r, fault)]
        evidence_at = after[EVIDENCE - 1].at if len(after) >= EVIDENCE else None
        row: dict[str, Any] = {"seed": seed, "fault": fault.name, "found": found is not None}
        row["effect"] = fault.server is None or _evicted_after(run, fault) >= MIN_EVICTED_BLOCKS
        if found is not None:
            matched.add(found.pk)
            detected_at = (found.detected_at - run.start).total_seconds()
            commits = [
                c.sha for c in run.commits if c.template == fault.template and abs(c.time - fault.at) < 1
            ]
            # A template fault's delay runs from the first request on its version: it was live then.
            first = next((r.at for r in run.planned if r.version in commits), fault.at)
            row["delay_s"] = detected_at - (first if fault.template else fault.at)
            row["cycles"] = (detected_at - evidence_at) / 60 if evidence_at is not None else None
            row["suspect_ok"] = found.kind == fault.kind and (
                fault.template is None
                or (found.suspect_version is not None and found.suspect_version.commit_sha in commits)
            )
        rows.append(row)
    return rows, [r for r in regressions if r.pk not in matched]


def swinging(request: PlannedRequest) -> bool:
    """Tenfold swings by turns of ten minutes, and five idle minutes every twenty."""
    minute = int(request.at // 60)
    if minute % 20 >= 15:
        return False
    return (minute // 10) % 2 == 0 or request.index % 10 == 0


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--quiet-hours", type=int, default=5, help="seeds of a fault-free hour")
    parser.add_argument("--scenarios", default="demo,routing,sequence", help=f"of {', '.join(SCENARIOS)}")
    parser.add_argument("--no-baseline", action="store_true", help="skip the pass without the deploy check")
    args = parser.parse_args(argv)
    delays: dict[tuple[str, bool], dict[str, float]] = {}
    with throwaway_database(partitions=False):
        for name in args.scenarios.split(","):
            for deploy_check in (True,) if args.no_baseline else (True, False):
                scenario, faults = SCENARIOS[name]
                rows, stray = [], []
                for seed in range(args.seeds):
                    run = detected(scenario(), seed, deploy_check=deploy_check)
                    found, unmatched = fault_rows(run, seed, faults)
                    rows += found
                    stray += [
                        (seed, r.scope, r.scope_label, r.metric, r.kind,
                         (r.changed_at - run.start).total_seconds(), r.cause_shift)
                        for r in unmatched
                    ]  # fmt: skip
                label = name if deploy_check else f"{name} (baseline: the per-minute search alone)"
                delays[name, deploy_check] = report(label, faults, rows, stray, args.seeds)
            if (name, False) in delays:
                print_delays(name, delays[name, True], delays[name, False])
        quiet = demo() | {"duration": 3600, "timeline": []}
        false = []
        for seed in range(args.quiet_hours):
            detected(quiet, 1000 + seed, keep=swinging)
            false += [(seed, r.scope, r.scope_label, r.metric, r.kind) for r in Regression.objects.all()]
        per_hour = len(false) / max(args.quiet_hours, 1)
        print(f"\nfault-free hours (tenfold swings, 5-minute idle gaps): {args.quiet_hours}, "
              f"false regressions: {len(false)} ({per_hour:.2f} per hour)")  # fmt: skip
        for item in false:
            print("  ", item)


def print_delays(name: str, checked: dict[str, float], searched: dict[str, float]) -> None:
    """Each fault's median detection delay with the deploy check against the per-minute search alone."""
    print(f"\n{name}: median detection delay, with the deploy check against the per-minute search alone")
    for fault, delay in checked.items():
        print_figure(fault, delay, "s", searched.get(fault, float("nan")), "baseline: the search alone")


def report(
    name: str, faults: list[Fault], rows: list[dict[str, Any]], stray: list[tuple[Any, ...]], seeds: int
) -> dict[str, float]:
    print(f"\n{name} scenario, {seeds} seeds; a detection cycle is one minute, a deploy check 15 s")
    print(
        "fault            found  delay s (median, max)  cycles after the 50th request (median, max)", end=""
    )
    print("  suspect (or kind) right")
    medians = {}
    for fault in faults:
        of = [r for r in rows if r["fault"] == fault.name and r["effect"]]
        idle = sum(1 for r in rows if r["fault"] == fault.name and not r["effect"])
        hits = [r for r in of if r["found"]]
        delays = [r["delay_s"] for r in hits]
        cycles = [r["cycles"] for r in hits if r["cycles"] is not None]
        right = sum(1 for r in hits if r["suspect_ok"])
        delay = f"{statistics.median(delays):6.0f} {max(delays):6.0f}" if delays else "     -      -"
        medians[fault.name] = statistics.median(delays) if delays else float("nan")
        cycle = f"{statistics.median(cycles):6.1f} {max(cycles):6.1f}" if cycles else "     -      -"
        print(f"{fault.name:16} {len(hits):2}/{len(of):<2}  {delay}                {cycle}"
              f"                                  {right}/{len(hits)}")  # fmt: skip
        for r in of:
            if not r["found"]:
                print(f"   missed in seed {r['seed']}")
        if idle:
            print(f"   and {idle} seed(s) where the cut evicted under {MIN_EVICTED_BLOCKS} blocks in five "
                  "minutes (nothing to find): left out")  # fmt: skip
    print(f"regressions matching no fault: {len(stray)}")
    for item in stray:
        print("  ", item)
    return medians
