"""Block-hash chains per second, as the ingest computes them, against today's function and against
sha256 alone on the same bytes.

    .venv/bin/python -m bench blockhash [--prompts 2000] [--tokens 1800] [--rounds 7]

Pure CPU, one core, no database. --prompts prompts of --tokens token ids drawn from a 151,936-token
vocabulary (ids of 1, 3 and 5 bytes in CBOR, as real ones are), salted every third, at block
sizes 16 and 32. For each:
- `signed_block_hashes` (the ingest's path: app/domain/_chain.c when it was built) from lists of
  ids, and from ids already converted to int64 (`int64_ids`, as the ingest does once per prompt);
- the same in Python, as an install without a C compiler runs it (each block's CBOR built in one
  numpy pass, a sha256 per block);
- today's function, the same from int64: `signed_block_hashes` as it was before every block's CBOR
  was built in one numpy pass (frozen below, `today_signed_block_hashes`; it built each id's CBOR
  with numpy, then a message per block joined in Python for a new sha256);
- `block_hash_chain` (a BlockHash per block) mapped to signed int64;
- the floor: one sha256 call per block on the very messages the chain hashes, prepared beforehand.
Each figure is the best of --rounds runs, the runs of all of them taking turns (the machine may be
shared), in million blocks per second, with its ratio to today's function and to the floor. Every
path is first checked to give today's hashes, byte for byte.
"""

import argparse
import hashlib
import operator
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Final
from unittest import mock

import cbor2
import numpy as np
import numpy.typing as npt

from app.domain import blockhash
from app.domain.blockhash import (
    NONE_HASH,
    TokenIds,
    block_extra_keys,
    block_hash_chain,
    int64_ids,
    signed_block_hashes,
    wire_to_signed,
)

VOCABULARY = 151_936
TODAY = "today's function, from int64"
FLOOR = "sha256 alone on the same bytes (the floor)"


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=1800)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    drawn = np.random.default_rng(0).integers(0, VOCABULARY, (args.prompts, args.tokens))
    prompts: list[list[int]] = drawn.tolist()
    converted = [int64_ids(tokens) for tokens in prompts]
    salts = ["tenant-a" if n % 3 == 0 else None for n in range(args.prompts)]
    path = "app/domain/_chain.c" if blockhash.hashes_in_c() else "Python (_chain.c was not built)"
    print(f"signed_block_hashes hashes in {path}")
    for block_size in (16, 32):
        runs = _runs(prompts, converted, salts, block_size)
        _check(prompts[:50], salts[:50], block_size)
        best = _best_seconds(runs, args.rounds)
        blocks = len(prompts) * (args.tokens // block_size)
        shape = f"{args.prompts} prompts of {args.tokens} token ids"
        print(f"block size {block_size}: {shape}, {blocks:,} blocks, best of {args.rounds} runs")
        for name, seconds in best.items():
            rate = blocks / seconds
            today, floor = best[TODAY] / seconds, best[FLOOR] / seconds
            print(
                f"  {name}: {rate / 1e6:.2f} million blocks/s, {today:.2f}x today's, {floor:.2f} of the floor"
            )


def _runs(
    prompts: list[list[int]], converted: list[npt.NDArray[np.int64]], salts: list[str | None], block_size: int
) -> dict[str, Callable[[], object]]:
    """What is timed, by name: each hashes every prompt at block_size."""
    hashed = _messages(prompts, salts, block_size)

    def each(hash_prompt: Callable[[TokenIds, int, str | None], object], inputs: Sequence[TokenIds]) -> None:
        for tokens, salt in zip(inputs, salts, strict=True):
            hash_prompt(tokens, block_size, salt)

    def in_python() -> None:
        with _in_python():
            each(_signed, converted)

    def floor() -> None:
        sha256 = hashlib.sha256
        for message in hashed:
            sha256(message).digest()

    return {
        "signed_block_hashes, from lists": lambda: each(_signed, prompts),
        "signed_block_hashes, from int64": lambda: each(_signed, converted),
        "signed_block_hashes in Python, from int64": in_python,
        TODAY: lambda: each(today_signed_block_hashes, converted),
        "block_hash_chain + wire_to_signed, from int64": lambda: each(_objects, converted),
        FLOOR: floor,
    }


def _signed(tokens: TokenIds, block_size: int, salt: str | None) -> list[int]:
    return signed_block_hashes(tokens, block_size, cache_salt=salt)


def _signed_in_python(tokens: TokenIds, block_size: int, salt: str | None) -> list[int]:
    with _in_python():
        return _signed(tokens, block_size, salt)


def _in_python() -> AbstractContextManager[object]:
    """signed_block_hashes without app/domain/_chain.c, as an install without a compiler runs."""
    return mock.patch.object(blockhash, "_native", None)


def _objects(tokens: TokenIds, block_size: int, salt: str | None) -> list[int]:
    return [wire_to_signed(block.wire) for block in block_hash_chain(tokens, block_size, cache_salt=salt)]


def _messages(prompts: list[list[int]], salts: list[str | None], block_size: int) -> list[bytes]:
    """The CBOR each block's sha256 is taken of, as cbor2 writes it (parent digests included)."""
    found = []
    for tokens, salt in zip(prompts, salts, strict=True):
        parent = NONE_HASH
        for index in range(len(tokens) // block_size):
            block = tuple(tokens[index * block_size : (index + 1) * block_size])
            message = cbor2.dumps((parent, block, block_extra_keys(index, cache_salt=salt)), canonical=True)
            found.append(message)
            parent = hashlib.sha256(message).digest()
    return found


def _check(prompts: list[list[int]], salts: list[str | None], size: int) -> None:
    """Every timed path gives today's hashes (the floor aside, which hashes prepared messages)."""
    for tokens, salt in zip(prompts, salts, strict=True):
        expected = today_signed_block_hashes(int64_ids(tokens), size, salt)
        for found in (
            _signed(tokens, size, salt),
            _signed(int64_ids(tokens), size, salt),
            _signed_in_python(int64_ids(tokens), size, salt),
            _objects(tokens, size, salt),
        ):
            assert found == expected, "a path hashes apart from today's function"


def _best_seconds(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


# Today's function, frozen as the baseline: app.domain.blockhash.signed_block_hashes before every
# block's CBOR was built in one numpy pass (no LoRA here: the bench hashes none).
_BLOCK_HEAD: Final = b"\x83\x58\x20"
_DIGEST_WIRE: Final = np.dtype([("head", "V24"), ("signed", ">i8")])
_NUMPY_BLOCKS: Final = 16
_HEAD_BITS: Final = np.array([0, 0x18 << 8, 0x19 << 16, 0x1A << 32], dtype=np.int64)
_WIDTHS: Final = np.array([1, 2, 3, 5], dtype=np.int64)
_KEPT: Final = np.arange(8) >= 8 - _WIDTHS[:, None]


def today_signed_block_hashes(token_ids: TokenIds, block_size: int, cache_salt: str | None) -> list[int]:
    extra_keys = cbor2.dumps(block_extra_keys(0, cache_salt=cache_salt), canonical=True)
    later_keys = cbor2.dumps(block_extra_keys(1, cache_salt=cache_salt), canonical=True)
    digests: list[bytes] = []
    parent = NONE_HASH
    array_head, blocks = _today_encoded_blocks(token_ids, block_size)
    sha256 = hashlib.sha256
    for tokens in blocks:
        parent = sha256(b"".join((_BLOCK_HEAD, parent, array_head, tokens, extra_keys))).digest()
        digests.append(parent)
        extra_keys = later_keys
    return np.frombuffer(b"".join(digests), _DIGEST_WIRE)["signed"].tolist()  # type: ignore[no-any-return]


def _today_encoded_blocks(token_ids: TokenIds, block_size: int) -> tuple[bytes, Sequence[bytes | memoryview]]:
    count = len(token_ids) // block_size * block_size
    ids = _today_small_ids(token_ids) if count >= _NUMPY_BLOCKS * block_size else None
    if ids is None:
        tokens = tuple(map(operator.index, token_ids))
        return b"", [cbor2.dumps(tokens[start : start + block_size]) for start in range(0, count, block_size)]
    ids = ids[:count]
    size = (ids >= 24).astype(np.int8)
    size += ids >= 256
    size += ids >= 1 << 16
    encoded = (ids | _HEAD_BITS.take(size)).astype(">u8")
    data = memoryview(encoded.view(np.uint8)[_KEPT.take(size, axis=0).reshape(-1)].tobytes())
    ends = _WIDTHS.take(size).reshape(-1, block_size).sum(axis=1).cumsum().tolist()
    head = cbor2.dumps((0,) * block_size)[:-block_size]
    return head, [data[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def _today_small_ids(token_ids: TokenIds) -> npt.NDArray[np.int64] | None:
    try:
        ids = int64_ids(token_ids)
    except OverflowError:
        return None
    if ids.min() < 0 or ids.max() >= 1 << 32:
        return None
    return ids
