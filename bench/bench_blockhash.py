"""block_hash_chain's cost per 1,000 token ids, for prompts of 128 to 32K token ids (block size 32).

    .venv/bin/python -m bench.bench_blockhash [--rounds 30]

Pure CPU, no database. Token ids are drawn from a 151,936-token vocabulary (ids of 1, 3 and 5 bytes
in CBOR, as real ones are). For each prompt length, unsalted and salted: the chain alone, and the
chain with its hashes as the ingest stores them (signed int64); the best of --rounds runs
(bench/timing.py), in microseconds per chain and per 1,000 token ids.
"""

import argparse
import random

from app.domain.blockhash import block_hash_chain, wire_to_signed
from bench.timing import best_seconds

LENGTHS = [128, 512, 2048, 8192, 32768]
VOCABULARY = 151_936


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    rng = random.Random(0)
    print(f"{'tokens':>7} {'salt':>5} {'chain us':>10} {'us/1K':>7} {'+ signed us':>12} {'us/1K':>7}")
    for length in LENGTHS:
        tokens = [rng.randrange(VOCABULARY) for _ in range(length)]
        for salt in (None, "tenant-a"):
            repeat = max(1, 16384 // length)

            def chain(tokens: list[int] = tokens, salt: str | None = salt, repeat: int = repeat) -> None:
                for _ in range(repeat):
                    block_hash_chain(tokens, 32, cache_salt=salt)

            def stored(tokens: list[int] = tokens, salt: str | None = salt, repeat: int = repeat) -> None:
                for _ in range(repeat):
                    [wire_to_signed(h.wire) for h in block_hash_chain(tokens, 32, cache_salt=salt)]

            alone = best_seconds(chain, args.rounds) / repeat * 1e6
            signed = best_seconds(stored, args.rounds) / repeat * 1e6
            per = 1000 / length
            print(f"{length:>7} {'yes' if salt else 'no':>5} {alone:>10.1f} {alone * per:>7.1f} "
                  f"{signed:>12.1f} {signed * per:>7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
