"""numpy's CBOR of a prompt's blocks is cbor2's, byte for byte, and the chains hashed on it are vLLM's
sha256_cbor: the sha256 of cbor2's canonical dumps of (parent, tokens, extra_keys), block after block.

tests/domain/test_blockhash.py holds both encodings to the hashes a real vLLM server published.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

import cbor2
import numpy as np
import pytest

from app.domain import blockhash, blockhash_cbor
from app.domain.blockhash import (
    NONE_HASH,
    LoraKey,
    block_extra_keys,
    block_hash_chain,
    int64_ids,
    signed_block_hashes,
    to_wire,
    wire_to_signed,
)
from app.domain.blockhash_cbor import encoded_blocks
from tests.support.hash_paths import HASH_PATHS, use_hash_path

# Where CBOR's encoding of an id grows (1, 2, 3 and 5 bytes), and the largest id numpy encodes.
WIDTH_EDGES = [0, 1, 23, 24, 255, 256, 65_535, 65_536, 151_935, 2**31 - 1, 2**31, 2**32 - 1]
LORA = LoraKey("support-lora", "/adapters/support-lora")
NO_KEYS = cbor2.dumps(None)
LORA_KEYS = cbor2.dumps(block_extra_keys(1, lora=LORA), canonical=True)
KEYS = [(None, None), ("tenant-a", None), (None, LORA), ("tenant-a", LORA)]


def _prompt(length: int, seed: int = 0) -> list[int]:
    """Vocabulary ids, with every width edge among them."""
    rng = random.Random(seed)
    return [rng.choice(WIDTH_EDGES) if rng.random() < 0.3 else rng.randrange(151_936) for _ in range(length)]


def _cbor2_blocks(ids: Sequence[int], block_size: int, tail: bytes) -> list[bytes]:
    full = len(ids) // block_size * block_size
    return [
        cbor2.dumps(tuple(ids[start : start + block_size])) + tail for start in range(0, full, block_size)
    ]


def _sha256_cbor_chain(ids: Sequence[int], block_size: int, **keys: Any) -> list[bytes]:
    """vLLM's chain, plainly: hash_block_tokens with sha256_cbor over each full block."""
    parent, chain = NONE_HASH, []
    for index in range(len(ids) // block_size):
        tokens = tuple(int(token) for token in ids[index * block_size : (index + 1) * block_size])
        message = cbor2.dumps((parent, tokens, block_extra_keys(index, **keys)), canonical=True)
        parent = hashlib.sha256(message).digest()
        chain.append(parent)
    return chain


@pytest.fixture(params=HASH_PATHS)
def encoding(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A chain's blocks CBOR-encoded by cbor2 (as a short prompt's are), then by numpy (a long
    one's), then the chain hashed by app/domain/_chain.c."""
    use_hash_path(request.param, monkeypatch)
    return str(request.param)


@pytest.mark.parametrize("tail", [NO_KEYS, LORA_KEYS], ids=["no-keys", "lora"])
@pytest.mark.parametrize("block_size", [1, 16, 23, 24, 32, 255, 256, 300])  # array heads of 1, 2 and 3 bytes
def test_each_block_is_cbor2s_encoding_of_its_ids_then_the_tail(block_size: int, tail: bytes) -> None:
    ids = _prompt(4000, seed=block_size)
    assert encoded_blocks(int64_ids(ids), block_size, tail) == _cbor2_blocks(ids, block_size, tail)


@pytest.mark.parametrize("edge", WIDTH_EDGES)
def test_ids_at_every_width_edge_encode_as_cbor2_writes_them(edge: int) -> None:
    ids = [edge, max(edge - 1, 0), edge, min(edge + 1, 2**32 - 1)] * 16
    assert encoded_blocks(int64_ids(ids), 16, NO_KEYS) == _cbor2_blocks(ids, 16, NO_KEYS)


@pytest.mark.parametrize("odd", [-1, -24, -(2**63), 2**32, 2**40, 2**63 - 1])
def test_ids_outside_0_to_2_32_are_left_to_cbor2(odd: int) -> None:
    ids = [*range(1000), odd, *range(100)]
    assert encoded_blocks(int64_ids(ids), 16, NO_KEYS) is None


@pytest.mark.parametrize(("length", "blocks"), [(0, 0), (15, 0), (16, 1), (17, 1), (1800, 112)])
def test_a_trailing_partial_block_is_left_out(length: int, blocks: int) -> None:
    encoded = encoded_blocks(int64_ids(_prompt(length)), 16, NO_KEYS)
    assert encoded is not None
    assert len(encoded) == blocks


def test_numpy_ids_of_any_layout_encode_as_their_values() -> None:
    ids = np.array(_prompt(3600), dtype=np.int64)
    strided = ids[::2]
    assert encoded_blocks(strided, 16, NO_KEYS) == _cbor2_blocks(strided.tolist(), 16, NO_KEYS)
    narrow = ids.astype(np.uint32)
    assert encoded_blocks(int64_ids(narrow), 16, NO_KEYS) == _cbor2_blocks(ids.tolist(), 16, NO_KEYS)


@pytest.mark.parametrize("block_size", [0, -16])
def test_block_size_must_be_positive(block_size: int) -> None:
    with pytest.raises(ValueError, match="block_size"):
        encoded_blocks(int64_ids(range(64)), block_size, NO_KEYS)


def test_a_block_holding_the_separator_is_left_to_cbor2() -> None:
    # A path of 255 bytes has the CBOR head 0x78 0xff: this one's extra keys hold the separator.
    lora = LoraKey("odd", "-block-".ljust(255, "x"))
    tail = cbor2.dumps(block_extra_keys(1, lora=lora), canonical=True)
    ids = _prompt(1000)
    assert blockhash_cbor._SEPARATOR in tail
    assert encoded_blocks(int64_ids(ids), 16, tail) is None
    expected = _sha256_cbor_chain(ids, 16, cache_salt="tenant-a", lora=lora)
    assert [block.digest for block in block_hash_chain(ids, 16, cache_salt="tenant-a", lora=lora)] == expected


@pytest.mark.parametrize(("cache_salt", "lora"), KEYS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("kind", ["list", "int64"])
def test_signed_block_hashes_are_the_sha256_cbor_chain(
    encoding: str, kind: str, block_size: int, cache_salt: str | None, lora: LoraKey | None
) -> None:
    ids = _prompt(1800, seed=block_size)
    tokens = ids if kind == "list" else int64_ids(ids)
    expected = _sha256_cbor_chain(ids, block_size, cache_salt=cache_salt, lora=lora)

    signed = signed_block_hashes(tokens, block_size, cache_salt=cache_salt, lora=lora)
    assert signed == [wire_to_signed(to_wire(digest)) for digest in expected]
    chain = block_hash_chain(tokens, block_size, cache_salt=cache_salt, lora=lora)
    assert [block.digest for block in chain] == expected


@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 16 * 16 - 1, 16 * 16, 16 * 16 + 1])
@pytest.mark.parametrize("kind", ["list", "int64"])
def test_prompts_around_one_block_and_the_numpy_threshold_hash_alike(kind: str, length: int) -> None:
    ids = _prompt(length, seed=length)
    tokens = ids if kind == "list" else int64_ids(ids)
    expected = _sha256_cbor_chain(ids, 16, cache_salt="tenant-a")
    signed = signed_block_hashes(tokens, 16, cache_salt="tenant-a")
    assert signed == [wire_to_signed(to_wire(digest)) for digest in expected]


@pytest.mark.parametrize("odd", [2**32, 2**40, 2**64 - 1, 2**70, -1])
def test_a_long_prompt_with_an_id_numpy_cannot_encode_hashes_through_cbor2(odd: int) -> None:
    ids = [*_prompt(1000), odd, *_prompt(800, seed=1)]
    expected = _sha256_cbor_chain(ids, 16, cache_salt="tenant-a", lora=LORA)
    signed = signed_block_hashes(ids, 16, cache_salt="tenant-a", lora=LORA)
    assert signed == [wire_to_signed(to_wire(digest)) for digest in expected]


def test_an_empty_prompt_has_no_block() -> None:
    assert signed_block_hashes([], 16) == []
    assert signed_block_hashes(np.zeros(0, dtype=np.int64), 16) == []
    assert block_hash_chain([], 16) == []


def test_the_chain_in_c_was_built_at_install() -> None:
    # The set-up command compiles app/domain/_chain.c; without it every ingest hashes a quarter
    # as fast. A machine with no C compiler still runs, and fails here to say so.
    assert blockhash.hashes_in_c(), "app/domain/_chain.c was not built: is gcc installed?"
