"""Block-key chains of a whole trace's token ids at once, in numpy.

A block's key must name its tokens and every token before it, within its scope (model and salt),
as vLLM's chained hashes do; its bit pattern need not be vLLM's (an analyzer compares a trace with
itself). Chaining block by block in Python costs a step per block, millions for a large trace, so
the chain is a sum instead: each block's tokens hash, with its position, to a 64-bit value (a
multiply-add over its tokens, then a splitmix64 finish), and block i's key is the finish of the
scope plus the sum of the values of blocks 0..i. Equal prefixes give equal keys; two different
ones collide with the odds of two random 64-bit values, as any 64-bit chain does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Int64s = npt.NDArray[np.int64]
_U64 = np.uint64
_CHUNK_BLOCKS = 1 << 14  # blocks hashed per numpy pass: bounds the temporaries (2 MB at 16)
_POSITION = _U64(0x9E3779B97F4A7C15)


def _finish(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finalizer, in place: every input bit reaches every output bit."""
    values ^= values >> _U64(30)
    values *= _U64(0xBF58476D1CE4E5B9)
    values ^= values >> _U64(27)
    values *= _U64(0x94D049BB133111EB)
    values ^= values >> _U64(31)
    return values


def _multipliers(block_size: int) -> npt.NDArray[np.uint64]:
    """Odd 64-bit multipliers, one per token position of a block, the same in every process."""
    digest = hashlib.shake_256(f"prefixscope-analyzer-{block_size}".encode()).digest(8 * block_size)
    return np.frombuffer(digest, dtype="<u8").astype(_U64) | _U64(1)


def scope_key(scope: str) -> int:
    """A scope's (model, salt) 64-bit start, the same in every process."""
    return int.from_bytes(hashlib.blake2b(scope.encode(), digest_size=8).digest(), "little")


def chain_keys(
    tokens: npt.NDArray[np.int32],
    spans: Sequence[tuple[int, int]],
    scopes: Sequence[Sequence[int]],
    block_size: int,
) -> tuple[list[Int64s], Int64s]:
    """The keys of every full block of each span of `tokens`, once per scope.

    `spans`: each request's (start, end) in `tokens`, every start a multiple of `block_size` (the
    reader pads each request to a whole block: numpy then hashes the buffer as rows of a block).
    `scopes[k][r]`: request r's scope key for the k-th chain asked for (the salted chain, then the
    salt-neutral one, say). Returns one array of keys per scope, the requests' blocks one after the
    other, and the offsets of each request's first block (length len(spans) + 1). Raises
    ValueError when block_size < 1 or a span does not start on a block.
    """
    if block_size < 1:
        raise ValueError(f"block size must be positive, got {block_size}")
    starts = np.fromiter((start for start, _ in spans), dtype=np.int64, count=len(spans))
    ends = np.fromiter((end for _, end in spans), dtype=np.int64, count=len(spans))
    if np.any(starts % block_size):
        raise ValueError("every span must start on a block boundary")
    counts = (ends - starts) // block_size
    offsets = np.zeros(len(spans) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    owner = np.repeat(np.arange(len(spans)), counts)
    index = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[owner]  # block index in its request
    rows = _row_values(tokens[: len(tokens) - len(tokens) % block_size].reshape(-1, block_size))
    sums = rows[starts[owner] // block_size + index]
    sums += (index.astype(_U64) + _U64(1)) * _POSITION
    np.cumsum(_finish(sums), out=sums)  # wraps modulo 2**64, as wanted
    # Each request's sum starts from zero: less the running sum before its first block.
    before = np.zeros(len(spans), dtype=_U64)
    has_before = offsets[:-1] > 0
    before[has_before] = sums[offsets[:-1][has_before] - 1]
    sums -= np.repeat(before, counts)
    chains = []
    for scoped in scopes:
        keyed = sums + np.repeat(np.asarray(scoped, dtype=_U64), counts)
        chains.append(_finish(keyed).view(np.int64))
    return chains, offsets


def _row_values(blocks: npt.NDArray[np.int32]) -> npt.NDArray[np.uint64]:
    """Each row's tokens hashed to 64 bits (a multiply-add), in chunks: one 64-bit copy of a large
    trace's tokens would cost more in page faults than the arithmetic."""
    multipliers = _multipliers(blocks.shape[1])
    values = np.empty(len(blocks), dtype=_U64)
    scratch = np.empty((min(_CHUNK_BLOCKS, len(blocks)), blocks.shape[1]), dtype=_U64)
    for first in range(0, len(blocks), _CHUNK_BLOCKS):
        chunk = blocks[first : first + _CHUNK_BLOCKS]
        wide = scratch[: len(chunk)]
        np.copyto(wide, chunk, casting="unsafe")  # token ids are never negative
        wide *= multipliers
        wide.sum(axis=1, dtype=_U64, out=values[first : first + len(chunk)])
    return values
