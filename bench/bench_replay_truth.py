"""The replay against ground truth: the demo fleet served through the simulator's prefix caches, its
trace replayed under another capacity or routing, and the fleet actually served that way.

`python -m bench replay_truth` prints, for each check of tests/support/replay_truth.py, the replay's
predicted hit rate, the served fleet's actual one and the difference in points (calibration within
2, predictions within 3: tests/domain/test_replay_truth.py asserts the same). The llm-d-style
prefix-aware fleet is served with its router choosing over the simulator's caches at each arrival.

With `--vllm`, the same for the real vLLM CPU server (tests/support/replay_vllm.py; started twice,
about a minute each): one trace sent at two `--num-gpu-blocks-override` values, each replayed at its
own blocks (calibration) and the first's at the second's (prediction), as
tests/e2e/test_replay_vllm.py asserts.
"""

import argparse
import time
from collections.abc import Sequence

from tests.support.replay_truth import Check, checks

VLLM_BLOCKS = (24, 40)  # as tests/e2e/test_replay_vllm.py


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vllm", action="store_true", help="the real vLLM CPU server's table too")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(f"{'check':<52} {'predicted':>9} {'actual':>7} {'diff':>6}  within")
    for check in checks():
        _row(check, f"{check.tolerance:g} pts")
    if args.vllm:
        _vllm_rows()
    print(f"\n{time.perf_counter() - started:.1f} s")


def _vllm_rows() -> None:
    from tests.support.replay_vllm import hit_rate, predicted, send_trace, truth_prompts
    from tests.support.vllm_cpu import DATA_DIR, serve

    prompts, traces = truth_prompts(), {}
    for blocks in VLLM_BLOCKS:
        with serve(num_blocks=blocks, log_path=DATA_DIR / f"server-replay-{blocks}.log") as server:
            traces[blocks] = send_trace(server, prompts, name=f"vllm-{blocks}")
    print(f"\nthe real vLLM CPU server, {len(prompts)} requests one at a time, block size 32")
    small, large = VLLM_BLOCKS
    rows = [(f"calibration at {b} blocks", traces[b], b, traces[b]) for b in VLLM_BLOCKS]
    rows.append((f"traced at {small}, predicted at {large} blocks", traces[small], large, traces[large]))
    for name, trace, blocks, truth in rows:
        rate, reused = predicted(trace, num_blocks=blocks, block_size=trace[0].block_size)
        exact = sum(r.cached_tokens == mine for r, mine in zip(truth, reused, strict=True))
        actual = hit_rate(truth)
        print(
            f"{name:<52} {rate:9.2f} {actual:7.2f} {rate - actual:+6.2f}  {exact}/{len(truth)} requests exact"
        )


def _row(check: Check, within: str) -> None:
    predicted, actual = check.measure()
    print(f"{check.name:<52} {predicted:9.2f} {actual:7.2f} {predicted - actual:+6.2f}  {within}")
