"""What the benchmarks share for timing code that runs in this process."""

import time
from collections.abc import Callable


def best_seconds(run: Callable[[], object], rounds: int) -> float:
    """The fastest of `rounds` runs: the least disturbed run is the one that measures the code."""
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        timings.append(time.perf_counter() - started)
    return min(timings)
