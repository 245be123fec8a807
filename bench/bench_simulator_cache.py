"""How many requests per second one core pushes through the simulated prefix caches of 4 servers.

Run from the repository root (so that ``simulator`` and ``app`` import):
    .venv/bin/python -m bench simulator_cache [requests]

The mix: 2,048-token prompts made of one of 8 shared system prefixes (1,536 tokens) and a
unique question (512 tokens), 16 generated tokens each, routed round-robin to 4 caches of
2,048 blocks x 16 tokens (vLLM's default block size), so prefixes hit and questions evict.
Each request is admit, append_output (all tokens at once), finish, and its events are taken.

The baseline computes ``block_hash_chain`` for the same prompts and nothing else: the hashing
every simulated request must do. The fleet needs >= 500 simulated requests/s per core.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from app.domain.blockhash import block_hash_chain
from bench.harness import best_seconds
from simulator.cache import PrefixCache

SERVERS = 4
BLOCK_SIZE = 16
NUM_BLOCKS = 2048
PREFIXES = 8
PREFIX_TOKENS = 1536
QUESTION_TOKENS = 512
OUTPUT_TOKENS = 16
VOCAB = 50257
ROUNDS = 3  # best of: the least disturbed run is the one that measures the code


def make_prompts(count: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Return ``count`` (prompt, output) pairs; the same seed gives the same traffic."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]
    traffic = []
    for _ in range(count):
        question = [rng.randrange(VOCAB) for _ in range(QUESTION_TOKENS)]
        output = [rng.randrange(VOCAB) for _ in range(OUTPUT_TOKENS)]
        traffic.append((rng.choice(prefixes) + question, output))
    return traffic


def simulate(traffic: Sequence[tuple[list[int], list[int]]]) -> tuple[int, int]:
    """Run the traffic through fresh caches; return (events emitted, cached tokens)."""
    caches = [PrefixCache(BLOCK_SIZE, NUM_BLOCKS) for _ in range(SERVERS)]
    events = cached = 0
    for index, (prompt, output) in enumerate(traffic):
        cache = caches[index % SERVERS]
        request_id = f"req-{index}"
        cached += cache.admit(request_id, prompt).cached_tokens
        cache.append_output(request_id, output)
        cache.finish(request_id)
        events += len(cache.take_events())
    return events, cached


def hash_only(traffic: Sequence[tuple[list[int], list[int]]]) -> None:
    for prompt, _ in traffic:
        block_hash_chain(prompt, BLOCK_SIZE)


def main(argv: Sequence[str]) -> None:
    count = int(argv[0]) if argv else 2000
    traffic = make_prompts(count)
    events, cached = simulate(traffic)
    prompt_tokens = sum(len(prompt) for prompt, _ in traffic)
    ours = count / best_seconds(lambda: simulate(traffic), ROUNDS)
    baseline = count / best_seconds(lambda: hash_only(traffic), ROUNDS)
    shape = f"{PREFIX_TOKENS + QUESTION_TOKENS:,}-token prompts, {SERVERS} caches of {NUM_BLOCKS:,} blocks"
    print(f"{count:,} requests of {shape} x {BLOCK_SIZE} tokens, best of {ROUNDS}")
    print(f"hit rate {cached / prompt_tokens:.1%}, {events / count:.1f} KV events per request")
    print(f"admit + append_output + finish: {ours:10,.0f} requests/s ({1e3 / ours:.2f} ms/request)")
    print(f"block_hash_chain only:          {baseline:10,.0f} requests/s ({1e3 / baseline:.2f} ms/request)")
    print(f"ratio simulator / baseline: {ours / baseline:.2f}; target >= 500 requests/s per core")
