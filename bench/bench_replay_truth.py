"""The replay against ground truth: the demo fleet served through the simulator's prefix caches, its
trace replayed under another capacity or routing, and the fleet actually served that way.

`python -m bench replay_truth` prints, for each check of tests/support/replay_truth.py, the replay's
predicted hit rate, the served fleet's actual one and the difference in points (calibration within
2, predictions within 3: tests/domain/test_replay_truth.py asserts the same), then the replay's
llm-d-style prefix-aware router beside the planner's affinity router, which it is not.
"""

import argparse
import time
from collections.abc import Sequence

from tests.support.replay_truth import Check, checks, router_comparisons


def main(argv: Sequence[str]) -> None:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    started = time.perf_counter()
    print(f"{'check':<46} {'predicted':>9} {'actual':>7} {'diff':>6}  within")
    for check in checks():
        _row(check, f"{check.tolerance:g} pts")
    print("\nnot predictions: the replay's llm-d-style router vs the planner's affinity router, served")
    for check in router_comparisons():
        _row(check, "-")
    print(f"\n{time.perf_counter() - started:.1f} s")


def _row(check: Check, within: str) -> None:
    predicted, actual = check.measure()
    print(f"{check.name:<46} {predicted:9.2f} {actual:7.2f} {predicted - actual:+6.2f}  {within}")
