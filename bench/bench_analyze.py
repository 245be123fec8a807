"""`prefixscope analyze` end to end against prefixlens 0.1.0 on bench/analysis_trace.py's trace.

    .venv/bin/python -m bench analyze [--requests 20000] [--block-sizes 16,32] [--work /tmp/ps-bench-analysis]

Each side is a child process, timed from its start to its exit (interpreter start and imports
included): `python -m app.analyzer analyze TRACE --block-size B --json` (the `prefixscope`
console script's module; the trace says no capacity, so an unlimited cache, and the what-if curve
replayed at fractions of the trace's footprint) and `prefixlens analyze TRACE --block-size B
--capacity-blocks 1000000000 --json` from the virtualenv bench_analysis makes. Wall and CPU seconds
(os.wait4's user + system, workers included) and the peak memory of each process tree
(proportional set size, sampled; at least the largest process' ru_maxrss). The report's
`--no-curve` is timed too, to show what the curve costs.
Target: prefixlens / prefixscope >= 10 in wall time, prefixscope's peak at most half of prefixlens'.
"""

import argparse
import contextlib
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

SAMPLE_SECONDS = 0.05  # a sample reads the tree's smaps_rollup: a few ms of the shared cores


@dataclass(frozen=True)
class Run:
    wall: float
    cpu: float
    peak_mb: float


def run(command: list[str], *, tree: bool = True) -> Run:
    """Run `command` to its end, its output discarded; its wall and CPU seconds (with its
    workers') and its peak memory: of its process tree, the proportional set size (PSS: a page
    forked workers share is counted once in all), sampled every SAMPLE_SECONDS; without `tree`,
    of the one process, its ru_maxrss (a sample reads its pages while it runs: prefixlens' 1.6 GB
    took it seconds longer, to our side's favour)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    peak = _peak_pss(child) if tree else 0
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(command[:3])} ... failed")
    # A sample may miss a short peak; the largest process' own peak (ru_maxrss) cannot.
    return Run(wall, usage.ru_utime + usage.ru_stime, max(peak, usage.ru_maxrss * 1024) / 2**20)


def _peak_pss(child: subprocess.Popen[bytes]) -> int:
    """The most the child's process tree held at once, in bytes, until it exits (a zombie then,
    waited for by the caller)."""
    root = psutil.Process(child.pid)
    peak = 0
    while root.status() != psutil.STATUS_ZOMBIE:
        held = 0
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                held += process.memory_full_info().pss
        peak = max(peak, held)
        time.sleep(SAMPLE_SECONDS)
    return peak


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--block-sizes", default="16,32", help="comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ps-bench-analysis"), help="traces, venv")
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
        ours = run([sys.executable, "-m", "app.analyzer", "analyze", trace, "--block-size", block, "--json"])
        bare = run([sys.executable, "-m", "app.analyzer", "analyze", trace, "--block-size", block, "--json",
                    "--no-curve"])  # fmt: skip
        alone = run([sys.executable, "-m", "app.analyzer", "analyze", trace, "--block-size", block, "--json",
                     "--jobs", "1"])  # fmt: skip
        theirs = run([str(prefixlens), "analyze", trace, "--block-size", block,
                      "--capacity-blocks", str(UNLIMITED_BLOCKS), "--json"], tree=False)  # fmt: skip
        for name, measured in (
            ("prefixscope", ours),
            ("prefixscope --no-curve", bare),
            ("prefixscope --jobs 1", alone),
            ("prefixlens", theirs),
        ):
            print(f"{size:>5}  {name:<24} {measured.wall:7.2f} {measured.cpu:7.2f} {measured.peak_mb:9,.0f}")
        print(f"       ratio prefixlens/prefixscope: wall {theirs.wall / ours.wall:.2f}"
              f" ({theirs.wall / bare.wall:.2f} without the curve,"
              f" {theirs.wall / alone.wall:.2f} on one core),"
              f" peak {ours.peak_mb / theirs.peak_mb:.2f} of theirs")  # fmt: skip
    print(f"target: wall ratio >= 10, peak at most 0.5 of prefixlens' ({default_jobs()} cores here)")
