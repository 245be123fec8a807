"""The CBOR of every full block of a prompt, built at once with numpy: what vLLM's ``sha256_cbor``
hashes after each block's parent digest (app.domain.blockhash chains the digests).

A block's hash is the sha256 of the CBOR of (parent, tokens, extra_keys). CBOR (RFC 8949) writes an
array as a head that gives its length, then its items; an integer 0 <= n < 2**32 in the fewest bytes
(cbor2 always does, canonical or not): n itself below 24, else a head byte of 0x18, 0x19 or 0x1a
followed by n in 1, 2 or 4 big-endian bytes. cbor2 takes about 50 ns a token id, a block of 16 twice
its sha256. numpy writes every id of a prompt into a slot of 5 bytes, its head byte then n in 4
big-endian bytes, flags the bytes that CBOR keeps and gathers them, which leaves the caller a sha256
per block. tests/domain/test_blockhash_cbor.py holds this to cbor2.
"""

from __future__ import annotations

import functools
from typing import Final

import cbor2
import numpy as np
import numpy.typing as npt

ID_LIMIT: Final = 1 << 32
"""Token ids from 0 to ID_LIMIT - 1 are encoded here (a vocabulary is far smaller); others are not."""


def _heads() -> npt.NDArray[np.uint8]:
    ids = np.arange((1 << 16) + 1)
    return np.select([ids < 24, ids < 256, ids < 1 << 16], [ids, 0x18, 0x19], 0x1A).astype(np.uint8)


_HEADS: Final = _heads()
"""An id's head byte, by min(id, 2**16): a lookup (64 KB) costs less than comparing each id thrice."""


def _value_kept() -> npt.NDArray[np.uint32]:
    kept = np.zeros((0x1B, 4), np.bool_)  # by head byte: which of the id's 4 bytes follow the head
    kept[0x18, 3:] = True
    kept[0x19, 2:] = True
    kept[0x1A, :] = True
    return kept.view(np.uint32).reshape(-1)


_VALUE_KEPT: Final = _value_kept()
"""By head byte, the flags of the 4 value bytes as one uint32 (an id below 24 is its head alone)."""


@functools.cache
def array_head(length: int) -> bytes:
    """The CBOR head of an array of ``length`` items, as cbor2 writes it."""
    return cbor2.dumps((0,) * length)[:-length]  # the items, zeros, are a byte each


def encoded_blocks(ids: npt.NDArray[np.int64], block_size: int, tail: bytes) -> list[bytes] | None:
    """Every full block's CBOR after its parent: the array of its ids as cbor2 writes the tuple of
    them, then ``tail`` (the encoded extra keys).

    A trailing partial block is left out. None when an id is outside 0..ID_LIMIT - 1 (cbor2 encodes
    those), or when the ids' bytes hold _SEPARATOR (never by chance). ValueError when block_size <= 0.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    blocks = len(ids) // block_size
    if blocks == 0:
        return []
    ids = ids[: blocks * block_size]
    if np.maximum.reduce(ids.view(np.uint64)) >= ID_LIMIT:  # a negative id views as a huge one
        return None
    by_block = ids.reshape(blocks, block_size)
    rows, kept = _block_rows(by_block, array_head(block_size), tail + _SEPARATOR)
    pieces = rows[kept].tobytes().split(_SEPARATOR)
    if len(pieces) != blocks + 1:  # the separator inside a block too
        return None
    pieces.pop()  # what follows the last separator: nothing
    return pieces


# Cutting the gathered bytes into blocks by a Python slice each costs about as much as gathering
# them; bytes.split cuts them at once, at a separator that ends every row. Its first byte occurs in it
# once, so two occurrences never overlap and split finds each: one inside a block (ids cannot make
# it, an adapter's path could) gives a piece too many.
_SEPARATOR: Final = b"\xff-block-"


def _block_rows(
    ids: npt.NDArray[np.int64], head: bytes, tail: bytes
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """A row of bytes per block, the array head, a slot per id and the tail; and which of them CBOR keeps.

    An id's slot is 5 bytes: its head byte, then the id in 4 big-endian bytes. Its flags are laid out
    the same, those of the 4 value bytes written at once as a uint32 of four 0/1 bytes.
    """
    blocks, block_size = ids.shape
    width = len(head) + 5 * block_size + len(tail)
    rows = np.empty((blocks, width), np.uint8)
    kept = np.empty((blocks, width), np.bool_)
    kept.fill(True)
    rows[:, : len(head)] = np.frombuffer(head, np.uint8)
    rows[:, width - len(tail) :] = np.frombuffer(tail, np.uint8)
    shape, strides = (blocks, block_size), (width, 5)
    np.ndarray(shape, ">u4", rows, len(head) + 1, strides)[...] = ids
    heads = _HEADS.take(ids, mode="clip")
    np.ndarray(shape, np.uint8, rows, len(head), strides)[...] = heads
    np.ndarray(shape, np.uint32, kept, len(head) + 1, strides)[...] = _VALUE_KEPT.take(heads)
    return rows, kept
