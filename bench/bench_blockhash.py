"""Block-hash chains per second, as the ingest computes them, against sha256 alone on the same bytes.

    .venv/bin/python -m bench.bench_blockhash [--prompts 2000] [--tokens 1800] [--rounds 7]

Pure CPU, one core, no database. --prompts prompts of --tokens token ids drawn from a 151,936-token
vocabulary (ids of 1, 3 and 5 bytes in CBOR, as real ones are), salted every third, at block
sizes 16 and 32. For each: `signed_block_hashes` (the ingest's path) from lists of ids and from
ids already converted to int64 (`int64_ids`, as the ingest does once per prompt);
`block_hash_chain` (a BlockHash per block) mapped to signed int64 as before the fast path; and
the floor: one sha256 call per block on the very messages the chain hashes, prepared beforehand.
Each figure is the best of --rounds runs, the runs of all four taking turns (the machine may be
shared), in million blocks per second, with its ratio to the floor.
"""

import argparse
import hashlib
import random
import time
from collections.abc import Callable

from app.domain.blockhash import (
    NONE_HASH,
    block_extra_keys,
    block_hash_chain,
    int64_ids,
    signed_block_hashes,
    wire_to_signed,
)

VOCABULARY = 151_936


def messages(prompts: list[list[int]], salts: list[str | None], block_size: int) -> list[bytes]:
    """The CBOR each block's sha256 is taken of, as cbor2 writes it (parent digests included)."""
    import cbor2

    found = []
    for tokens, salt in zip(prompts, salts, strict=True):
        parent = NONE_HASH
        for index in range(len(tokens) // block_size):
            block = tuple(tokens[index * block_size : (index + 1) * block_size])
            message = cbor2.dumps((parent, block, block_extra_keys(index, cache_salt=salt)), canonical=True)
            found.append(message)
            parent = hashlib.sha256(message).digest()
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=1800)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(VOCABULARY) for _ in range(args.tokens)] for _ in range(args.prompts)]
    salts = ["tenant-a" if n % 3 == 0 else None for n in range(args.prompts)]
    converted = [int64_ids(tokens) for tokens in prompts]
    for block_size in (16, 32):
        hashed = messages(prompts, salts, block_size)

        def fast(inputs: list, size: int = block_size) -> None:  # type: ignore[type-arg]
            for tokens, salt in zip(inputs, salts, strict=True):
                signed_block_hashes(tokens, size, cache_salt=salt)

        def objects(size: int = block_size) -> None:
            for tokens, salt in zip(prompts, salts, strict=True):
                [wire_to_signed(block.wire) for block in block_hash_chain(tokens, size, cache_salt=salt)]

        def floor(found: list[bytes] = hashed) -> None:
            sha256 = hashlib.sha256
            for message in found:
                sha256(message).digest()

        runs: dict[str, Callable[[], None]] = {
            "signed_block_hashes, from lists": lambda: fast(prompts),
            "signed_block_hashes, from int64": lambda: fast(converted),
            "block_hash_chain + wire_to_signed": objects,
            "sha256 alone on the same bytes (the floor)": floor,
        }
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.rounds):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - started)
        blocks = len(hashed)
        floor_rate = blocks / best["sha256 alone on the same bytes (the floor)"]
        shape = f"{args.prompts} prompts of {args.tokens} token ids"
        print(f"block size {block_size}: {shape}, {blocks:,} blocks")
        for name, seconds in best.items():
            rate = blocks / seconds
            print(f"  {name}: {rate / 1e6:.2f} million blocks/s, {rate / floor_rate:.2f} of the floor")


if __name__ == "__main__":
    main()
