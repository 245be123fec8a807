"""`prefixscope analyze` end to end against prefixlens 0.1.0 on bench/analysis_trace.py's trace.

    .venv/bin/python -m bench analyze [--requests 20000] [--block-sizes 16,32] [--repeat 3]
                                      [--work /tmp/ps-bench-analysis]

Each side is a child process, timed from its start to its exit (interpreter start and imports
included): `python -m app.analyzer analyze TRACE --block-size B --json` (the `prefixscope`
console script's module; the trace says no capacity, so an unlimited cache, and the what-if curve
replayed at fractions of the trace's footprint) and `prefixlens analyze TRACE --block-size B
--capacity-blocks 1000000000 --json` from the virtualenv bench_analysis makes. Wall and CPU seconds
(os.wait4's user + system, workers included) and the peak memory of each (`_peak_bytes`). The report's
`--no-curve` is timed too, to show what the curve costs, and `--jobs 1`, the analyzer on one core.
Each side runs `--repeat` times, in turn with the others; the best wall and CPU seconds are kept.
Target: prefixlens / prefixscope >= 10 in wall time, prefixscope's peak at most half of prefixlens'.
The "diagnosis free" side (bench/analyze_bound.py) is the analyzer with its per-request diagnosis
answered at no cost: the bound of what making the diagnosis faster could win.
"""

import argparse
import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil

from app.analyzer.work import default_jobs
from bench.analysis_trace import write_traces
from bench.bench_analysis import UNLIMITED_BLOCKS, ensure_prefixlens

# The analyzer with its per-request diagnosis at no cost (bench/analyze_bound.py): the most any
# speed-up of the diagnosis could bring the ratio to.
DIAGNOSIS_FREE = "diagnosis free (bound)"
SAMPLE_SECONDS = 0.05  # a PSS sample reads the tree's smaps_rollup: a few ms of the shared cores


@dataclass(frozen=True)
class Run:
    wall: float
    cpu: float
    peak_mb: float


def run(command: list[str], *, tree: bool = False) -> Run:
    """Run `command` to its end, its output discarded; its wall and CPU seconds (with its
    workers') and its peak memory (`_peak_bytes`)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    peak = _peak_bytes(child, tree=tree)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(command[:3])} ... failed")
    return Run(wall, usage.ru_utime + usage.ru_stime, peak / 2**20)


def _peak_bytes(child: subprocess.Popen[bytes], *, tree: bool) -> int:
    """The most the child held at once, sampled every SAMPLE_SECONDS until it exits (a zombie
    then, waited for by the caller): its own resident high-water mark (VmHWM; ru_maxrss would
    start at this process' own, kept across exec), and with `tree` its process tree's proportional
    set size (PSS: a page forked workers share counted once). Reading PSS walks every page of the
    tree: it slowed the analyzer by a fifth and prefixlens by seconds, so a run that samples it is
    not one that is timed."""
    root = psutil.Process(child.pid)
    peak = 0
    while root.status() != psutil.STATUS_ZOMBIE:
        with contextlib.suppress(OSError, psutil.Error):
            peak = max(peak, _high_water(child.pid))
            if tree:
                peak = max(peak, sum(_pss(process) for process in [root, *root.children(recursive=True)]))
        time.sleep(SAMPLE_SECONDS)
    return peak


def _high_water(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _pss(process: psutil.Process) -> int:
    try:
        return int(process.memory_full_info().pss)
    except psutil.Error:  # it ended between the listing and the reading
        return 0


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--block-sizes", default="16,32", help="comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ps-bench-analysis"), help="traces, venv")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side, the best kept")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.block_sizes.split(",")]
    prefixlens = ensure_prefixlens(args.work / "prefixlens-venv")
    start = datetime.now(UTC) - timedelta(minutes=23)
    traces, tokens = write_traces(
        args.work, requests=args.requests, block_sizes=sizes, start=start, seconds=1200
    )
    print(f"{args.requests:,} requests, {tokens:,} prompt tokens, 8 templates, one server")
    print("block  side                      wall s   cpu s   peak MB")
    for size in sizes:
        trace, block = str(traces[size]), str(size)
        analyze = [sys.executable, "-m", "app.analyzer", "analyze", trace, "--block-size", block, "--json"]
        sides = {
            "prefixscope": analyze,
            "prefixscope --no-curve": [*analyze, "--no-curve"],
            "prefixscope --jobs 1": [*analyze, "--jobs", "1"],
            DIAGNOSIS_FREE: [sys.executable, "-m", "bench.analyze_bound", *analyze[4:]],
            "prefixlens": [str(prefixlens), "analyze", trace, "--block-size", block,
                           "--capacity-blocks", str(UNLIMITED_BLOCKS), "--json"],
        }  # fmt: skip
        runs: dict[str, list[Run]] = {name: [] for name in sides}
        for _ in range(args.repeat):  # the sides in turn: a slow spell of the machine slows each alike
            for name, command in sides.items():
                runs[name].append(run(command))
        for name, command in sides.items():  # the workers' memory, in a run of its own (untimed)
            if name not in ("prefixlens", DIAGNOSIS_FREE):  # one process: its VmHWM is its peak
                memory = run(command, tree=True)
                runs[name].append(Run(math.inf, math.inf, memory.peak_mb))
        best = {name: _best(measured) for name, measured in runs.items()}
        for name, measured in best.items():
            peak = "-" if name == DIAGNOSIS_FREE else f"{measured.peak_mb:,.0f}"  # its workers unmeasured
            print(f"{size:>5}  {name:<24} {measured.wall:7.2f} {measured.cpu:7.2f} {peak:>9}")
        ours, theirs = best["prefixscope"], best["prefixlens"]
        print(f"       ratio prefixlens/prefixscope: wall {theirs.wall / ours.wall:.2f}"
              f" ({theirs.wall / best['prefixscope --no-curve'].wall:.2f} without the curve,"
              f" {theirs.wall / best['prefixscope --jobs 1'].wall:.2f} on one core),"
              f" cpu {theirs.cpu / ours.cpu:.2f},"
              f" peak {ours.peak_mb / theirs.peak_mb:.2f} of theirs;"
              f" {theirs.wall / best[DIAGNOSIS_FREE].wall:.2f} in wall with the diagnosis free")  # fmt: skip
    print(f"target: wall ratio >= 10, peak at most 0.5 of prefixlens' ({default_jobs()} cores here)")


def _best(runs: list[Run]) -> Run:
    """The fastest wall and CPU seconds of the runs (what noise cannot make faster), the highest peak."""
    return Run(min(r.wall for r in runs), min(r.cpu for r in runs), max(r.peak_mb for r in runs))
