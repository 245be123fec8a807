"""How fast two 128K-token prompts are compared, against plain Python loops.

Run from the repository root:
    .venv/bin/python -m bench divergence [tokens]

The baseline is a plain Python loop finding the first differing token. It stops there and computes
nothing else, so it wins by far when the difference is near the top; the vectorised engine wins when the
common prefix is long. A second loop also walks back from the end to where the prompts re-align, the
least a plain-Python engine needs before it can report the edit; its ratio is the fairer one for the
first three cases (in the others the prompts end differently, so it stops at once).

The prompts are synthetic: token ids drawn from a Zipf law over GPT-2's 50,257-token vocabulary, so
that common tokens repeat as they do in text (which is what makes an edit search work). The target is
under 10 ms per comparison for the first two cases, the common ones: a short edit near the top, and a
one-token change near the top with everything after it identical. The others show the costs around
them: a change near the end (the baseline's worst case), an edit near the top plus a different last
question (the edit search crosses the whole prompt), and two unrelated prompts (the search gives up at
its bound). Times are the best of several runs; block hashes are not included (``block_statuses`` is
separate and costs 20 to 70 ms for 128K tokens; its time is printed last).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.domain.divergence import Compatibility, block_statuses, compare_prompts
from bench.harness import best_seconds

ROUNDS = 15  # best of: the least disturbed run is the one that measures the code
BLOCK_SIZE = 16
VOCABULARY = 50_257
RECORD = Compatibility(model="tiny")


def first_difference_loop(a: list[int], b: list[int]) -> int | None:
    """The baseline: the first index where a and b differ, in plain Python."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def common_ends_loop(a: list[int], b: list[int]) -> tuple[int, int]:
    """The second baseline: common prefix and common suffix lengths, in plain Python."""
    limit = min(len(a), len(b))
    prefix = next((i for i in range(limit) if a[i] != b[i]), limit)
    suffix = next((i for i in range(limit - prefix) if a[-1 - i] != b[-1 - i]), limit - prefix)
    return prefix, suffix


def text_like(rng: np.random.Generator, tokens: int) -> list[int]:
    """Token ids with text's skew: a few very common, most rare."""
    return [int(t) for t in rng.zipf(1.3, tokens) % VOCABULARY]


def cases(tokens: int) -> dict[str, tuple[list[int], list[int]]]:
    rng = np.random.default_rng(5)
    a = text_like(rng, tokens)
    question = text_like(rng, 40)
    timestamp = text_like(rng, 6)
    return {
        "6 tokens inserted at token 40": (a, a[:40] + timestamp + a[40:]),
        "1 token changed at token 10": (a, [*a[:10], a[10] + 1, *a[11:]]),
        "1 token changed 10 before the end": (a, [*a[:-10], a[-10] + 1, *a[-9:]]),
        "edit at token 40 + different last 40": (a, a[:40] + timestamp + a[40:-40] + question),
        "unrelated prompts": (a, text_like(rng, tokens)),
    }


def measure(name: str, a: list[int], b: list[int]) -> None:
    a_array, b_array = np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)
    lists = best_seconds(lambda: compare_prompts(a, b, BLOCK_SIZE, RECORD, RECORD), ROUNDS)
    arrays = best_seconds(lambda: compare_prompts(a_array, b_array, BLOCK_SIZE, RECORD, RECORD), ROUNDS)
    first = best_seconds(lambda: first_difference_loop(a, b), ROUNDS)
    ends = best_seconds(lambda: common_ends_loop(a, b), 3)
    result = compare_prompts(a, b, BLOCK_SIZE, RECORD, RECORD)
    edits = ", ".join(f"{e.kind} a[{e.a_start}:{e.a_end}] b[{e.b_start}:{e.b_end}]" for e in result.edits)
    print(
        f"{name:38} {lists * 1e3:6.2f} {arrays * 1e3:7.2f} {first * 1e3:7.3f} {lists / first:9.1f}x"
        f" {arrays / first:8.2f}x {ends * 1e3:7.2f} {lists / ends:6.2f}x {arrays / ends:6.3f}x"
    )
    inexact = "" if result.edits_exact else " (over the edit bound: one span)"
    print(f"{'':38} first divergence {result.first_divergence}, edits: {edits}{inexact}")


def main(argv: Sequence[str]) -> None:
    tokens = int(argv[0]) if argv else 131_072
    print(f"two {tokens:,}-token prompts, block size {BLOCK_SIZE}, best of {ROUNDS} runs; times in ms")
    print("engine: compare_prompts on lists / on numpy arrays; loop: first differing token;")
    print("ends: plain loop for the common prefix and suffix; ratios are engine time / loop time")
    print(
        f"{'case':38} {'lists':>6} {'arrays':>7} {'loop':>7} {'lists/loop':>10} {'arr/loop':>9}"
        f" {'ends':>7} {'l/ends':>7} {'a/ends':>7}"
    )
    for name, (a, b) in cases(tokens).items():
        measure(name, a, b)
    a, b = cases(tokens)["6 tokens inserted at token 40"]
    result = compare_prompts(a, b, BLOCK_SIZE, RECORD, RECORD)
    hashing = best_seconds(lambda: block_statuses(result, "b", b), 3)
    print(f"block_statuses of one {len(b):,}-token side (hash chain, computed apart): {hashing * 1e3:.1f} ms")
