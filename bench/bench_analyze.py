"""`prefixscope analyze` end to end against prefixlens 0.1.0 on bench/analysis_trace.py's trace.

    .venv/bin/python -m bench analyze [--requests 20000] [--block-sizes 16,32] [--work /tmp/ps-bench-analysis]

Each side is a child process, timed from its start to its exit (interpreter start and imports
included): `python -m app.analyzer analyze TRACE --block-size B --json` (the `prefixscope`
console script's module; the trace says no capacity, so an unlimited cache, and the what-if curve
replayed at fractions of the trace's footprint) and `prefixlens analyze TRACE --block-size B
--capacity-blocks 1000000000 --json` from the virtualenv bench_analysis makes. Wall and CPU seconds
(os.wait4's user + system) and peak resident set (ru_maxrss) of each. The report's
`--no-curve` is timed too, to show what the curve costs.
Target: prefixlens / prefixscope >= 10 in wall time, prefixscope's peak at most half of prefixlens'.
"""

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.analysis_trace import write_traces
from bench.bench_analysis import UNLIMITED_BLOCKS, ensure_prefixlens


@dataclass(frozen=True)
class Run:
    wall: float
    cpu: float
    peak_mb: float


def run(command: list[str]) -> Run:
    """Run `command` to its end, its output discarded; its wall and CPU seconds and peak RSS."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(command[:3])} ... failed")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


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
        theirs = run([str(prefixlens), "analyze", trace, "--block-size", block,
                      "--capacity-blocks", str(UNLIMITED_BLOCKS), "--json"])  # fmt: skip
        for name, measured in (
            ("prefixscope", ours),
            ("prefixscope --no-curve", bare),
            ("prefixlens", theirs),
        ):
            print(f"{size:>5}  {name:<24} {measured.wall:7.2f} {measured.cpu:7.2f} {measured.peak_mb:9,.0f}")
        print(f"       ratio prefixlens/prefixscope: wall {theirs.wall / ours.wall:.2f}"
              f" ({theirs.wall / bare.wall:.2f} without the curve),"
              f" peak {ours.peak_mb / theirs.peak_mb:.2f} of theirs")  # fmt: skip
    print("target: wall ratio >= 10, peak at most 0.5 of prefixlens'")
