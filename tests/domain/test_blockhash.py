"""The block-hash chain computes what a real vLLM server published in its KV events."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import numpy as np
import pytest

from app.domain.blockhash import (
    NONE_HASH,
    BlockHash,
    LoraKey,
    block_extra_keys,
    block_hash_chain,
    hash_block,
    int64_ids,
    signed_block_hashes,
    signed_to_wire,
    to_wire,
    wire_to_signed,
)
from tests.support.captures import VLLM_CPU_FIXTURES, load_json
from tests.support.hash_paths import HASH_PATHS, use_hash_path

BLOCK_SIZE = 32  # the captured server's --block-size
END_OF_REPLAY = "ff" * 8
ADAPTER = LoraKey("adapter", "/adapters/adapter")

# Recorded from a real vllm-cpu 0.32.0 server (tests/e2e/test_lora_vllm.py's recipe: the tiny model,
# block size 32, sha256_cbor, `--enable-lora --lora-modules support-lora=lora-adapter`, a relative
# path vLLM keeps verbatim), for the completion prompt LORA_PROMPT with model="support-lora".
LORA_PROMPT = list(range(1000, 1100))
SERVED_LORA = LoraKey("support-lora", "lora-adapter")
LORA_STORED = [14668664796378897133, 8582578731474051810, 9403654135668545891]
LORA_SALTED_STORED = [
    17028089871396827947,
    13697880138289299169,
    13476888025528312895,
]  # cache_salt="tenant-a"

Event = dict[str, Any]


@pytest.fixture(autouse=True, params=HASH_PATHS)
def token_encoding(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test thrice: the chain hashed in Python with every prompt's token ids CBOR-encoded by
    cbor2 (as a short prompt's are), then by numpy (as a long prompt's are; the captured prompts
    are all short), then by app/domain/_chain.c (what an install with a compiler runs)."""
    use_hash_path(request.param, monkeypatch)


def _load_completions() -> dict[str, Any]:
    """Captured completions with a response, by name ("salt-a-1", "evict-0", ...)."""
    completions = {}
    for path in sorted(VLLM_CPU_FIXTURES.glob("completion-*.json")):
        capture = load_json(path.name)
        if "response" in capture:
            completions[path.stem.removeprefix("completion-")] = capture
    return completions


COMPLETIONS = _load_completions()
CAPTURED_SALTS = sorted(
    {c["request"]["cache_salt"] for c in COMPLETIONS.values() if "cache_salt" in c["request"]}
)


def _prompt_ids(name: str) -> list[int]:
    ids: list[int] = COMPLETIONS[name]["response"]["choices"][0]["prompt_token_ids"]
    return ids


def _live_batches() -> list[Any]:
    return [frame["batch"] for frame in load_json("kv-live.decoded.json")]


def _replay_batches() -> list[Any]:
    # Each reply is ["", topic, seq, payload] in hex; an all-ones seq ends the replay.
    return [
        msgspec.msgpack.decode(bytes.fromhex(payload))
        for _, _, seq, payload in load_json("kv-replay-from-0.frames.json")
        if seq != END_OF_REPLAY
    ]


BATCH_SOURCES: dict[str, Callable[[], list[Any]]] = {
    "live": _live_batches,
    "replay": _replay_batches,
}


def _events(batches: list[Any], kind: str) -> Iterator[Event]:
    for _ts, events, _dp_rank in batches:
        yield from (event for event in events if event["type"] == kind)


def _wires(chain: list[BlockHash]) -> list[int]:
    return [block.wire for block in chain]


def _reproduce(event: Event, digests: dict[int, bytes]) -> tuple[list[BlockHash], str | None]:
    """Recompute one BlockStored event's blocks from its tokens; return them and the salt.

    An event starting a request (no parent) must be reproduced by exactly one of: no salt,
    or one salt a captured request used. A continuation chains on its parent's digest and
    takes no salt: vLLM salts a request's first block only.
    """
    tokens = event["token_ids"]
    if event["parent_block_hash"] is not None:
        parent = digests[event["parent_block_hash"]]
        chain = []
        for start in range(0, len(tokens), BLOCK_SIZE):
            block = hash_block(parent, tokens[start : start + BLOCK_SIZE])
            chain.append(block)
            parent = block.digest
        return chain, None
    candidates = {
        salt: block_hash_chain(tokens, BLOCK_SIZE, cache_salt=salt) for salt in [None, *CAPTURED_SALTS]
    }
    found = [s for s, chain in candidates.items() if _wires(chain) == event["block_hashes"]]
    assert len(found) == 1, f"event hashes reproduced by salts {found}"
    return candidates[found[0]], found[0]


def _reproduce_all(batches: list[Any]) -> list[tuple[Event, str | None]]:
    """Reproduce every BlockStored event in order; return each with its salt."""
    digests: dict[int, bytes] = {}
    results = []
    for event in _events(batches, "BlockStored"):
        chain, salt = _reproduce(event, digests)
        assert _wires(chain) == event["block_hashes"]
        digests.update((block.wire, block.digest) for block in chain)
        results.append((event, salt))
    return results


STORED_WIRES = {h for e in _events(_live_batches(), "BlockStored") for h in e["block_hashes"]}


@pytest.mark.parametrize("source", sorted(BATCH_SOURCES))
def test_every_stored_block_hash_is_reproduced_from_its_tokens(source: str) -> None:
    results = _reproduce_all(BATCH_SOURCES[source]())

    reproduced = {h for event, _ in results for h in event["block_hashes"]}
    assert reproduced == STORED_WIRES
    assert len(reproduced) > 50


def test_unsalted_blocks_need_no_salt_and_salted_ones_a_captured_salt() -> None:
    roots = [(e, salt) for e, salt in _reproduce_all(_live_batches()) if e["parent_block_hash"] is None]

    for event, salt in roots:
        # The event reports the bare salt on the first block, though the hash used a pair.
        reported = event["extra_keys"][0] if event["extra_keys"] else None
        assert reported == (None if salt is None else [salt])
    assert {salt for _, salt in roots} == {None, *CAPTURED_SALTS}


def test_the_salt_enters_the_first_block_as_a_tagged_pair() -> None:
    event = next(e for e in _events(_live_batches(), "BlockStored") if e["extra_keys"][0])
    (salt,) = event["extra_keys"][0]
    first_block = event["token_ids"][:BLOCK_SIZE]

    tagged = hash_block(None, first_block, (("cache_salt", salt),))
    assert tagged.wire == event["block_hashes"][0]
    assert block_extra_keys(0, cache_salt=salt) == (("cache_salt", salt),)
    bare = hash_block(None, first_block, (salt,))
    assert bare.wire != event["block_hashes"][0]


def test_replay_returns_the_batches_the_live_stream_carried() -> None:
    assert _replay_batches() == _live_batches()


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_every_full_prompt_block_of_a_request_is_among_the_stored_blocks(name: str) -> None:
    capture = COMPLETIONS[name]
    salt = capture["request"].get("cache_salt")
    chain = block_hash_chain(_prompt_ids(name), BLOCK_SIZE, cache_salt=salt)
    cached = capture["response"]["usage"]["prompt_tokens_details"]["cached_tokens"]

    # Cached blocks were stored by an earlier request, the others by this one.
    assert len(chain) * BLOCK_SIZE >= cached
    assert set(_wires(chain)) <= STORED_WIRES


def test_blocks_filled_by_generated_tokens_are_stored_too() -> None:
    decode_blocks = 0
    for name, capture in COMPLETIONS.items():
        generated = capture["response"]["choices"][0]["token_ids"]
        # The last generated token is never fed back, so its KV is never computed.
        fed = _prompt_ids(name) + generated[:-1]
        salt = capture["request"].get("cache_salt")
        chain = block_hash_chain(fed, BLOCK_SIZE, cache_salt=salt)
        assert set(_wires(chain)) <= STORED_WIRES
        decode_blocks += len(chain) - len(_prompt_ids(name)) // BLOCK_SIZE
    assert decode_blocks > 0


def test_the_shared_prefix_was_evicted_and_stored_again_by_the_last_request() -> None:
    batches = _live_batches()
    chain = _wires(block_hash_chain(_prompt_ids("shared-prefix-after-evictions"), BLOCK_SIZE))
    removed = {h for e in _events(batches, "BlockRemoved") for h in e["block_hashes"]}
    last_root = [e for e in _events(batches, "BlockStored") if e["parent_block_hash"] is None][-1]

    assert set(chain) <= removed
    assert last_root["block_hashes"] == chain


def test_requests_under_different_salts_share_no_block() -> None:
    prompt = _prompt_ids("salt-a-1")
    assert prompt == _prompt_ids("salt-b-1")

    chains = [
        set(_wires(block_hash_chain(prompt, BLOCK_SIZE, cache_salt=salt))) for salt in [None, *CAPTURED_SALTS]
    ]
    assert len(set.union(*chains)) == sum(len(chain) for chain in chains)


def test_none_hash_is_the_sha256_of_vllms_default_seed() -> None:
    expected = "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
    assert NONE_HASH.hex() == expected


def test_a_first_block_chains_on_the_none_hash() -> None:
    tokens = list(range(BLOCK_SIZE))
    assert hash_block(None, tokens) == hash_block(NONE_HASH, tokens)


@pytest.mark.parametrize(
    ("tokens", "block_size", "blocks"),
    [(0, 32, 0), (31, 32, 0), (32, 32, 1), (63, 32, 1), (64, 32, 2), (5, 1, 5)],
)
def test_a_trailing_partial_block_is_never_hashed(tokens: int, block_size: int, blocks: int) -> None:
    assert len(block_hash_chain(range(tokens), block_size)) == blocks


@pytest.mark.parametrize("block_size", [0, -32])
def test_block_size_must_be_positive(block_size: int) -> None:
    with pytest.raises(ValueError, match="block_size"):
        block_hash_chain(range(64), block_size)


def test_a_longer_prompt_extends_the_chain_of_its_prefix() -> None:
    prompt = list(range(1000, 1200))
    assert block_hash_chain(prompt, 16)[:5] == block_hash_chain(prompt[:90], 16)


def test_a_changed_token_changes_its_block_and_every_later_one() -> None:
    prompt = list(range(128))
    changed = [*prompt[:70], 99999, *prompt[71:]]

    before, after = block_hash_chain(prompt, 32), block_hash_chain(changed, 32)
    assert before[:2] == after[:2]
    assert all(old != new for old, new in zip(before[2:], after[2:], strict=True))


def test_a_lora_request_hashes_the_adapter_name_and_path_as_the_real_server_did() -> None:
    chain = block_hash_chain(LORA_PROMPT, BLOCK_SIZE, lora=SERVED_LORA)
    salted = block_hash_chain(LORA_PROMPT, BLOCK_SIZE, cache_salt="tenant-a", lora=SERVED_LORA)

    assert _wires(chain) == LORA_STORED
    assert _wires(salted) == LORA_SALTED_STORED
    # What Prefixscope hashed before, the name alone, and the base model match none of them.
    stored = {*LORA_STORED, *LORA_SALTED_STORED}
    name_only, parent = [], None
    for start in range(0, len(LORA_PROMPT) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = hash_block(parent, LORA_PROMPT[start : start + BLOCK_SIZE], (("lora", "support-lora"),))
        name_only.append(block.wire)
        parent = block.digest
    assert not stored & set(name_only)
    assert not stored & set(_wires(block_hash_chain(LORA_PROMPT, BLOCK_SIZE)))


def test_one_adapter_name_at_another_path_shares_no_block() -> None:
    moved = LoraKey(SERVED_LORA.name, "/srv/adapters/support-lora")
    chain = block_hash_chain(LORA_PROMPT, BLOCK_SIZE, lora=moved)
    served = block_hash_chain(LORA_PROMPT, BLOCK_SIZE, lora=SERVED_LORA)
    assert not set(_wires(chain)) & set(_wires(served))


@pytest.mark.parametrize(
    ("block_index", "cache_salt", "lora", "expected"),
    [
        (0, None, None, None),
        (0, "", None, None),
        (0, "tenant-a", None, (("cache_salt", "tenant-a"),)),
        (1, "tenant-a", None, None),
        (0, None, ADAPTER, (("lora", "adapter", "/adapters/adapter"),)),
        (3, None, ADAPTER, (("lora", "adapter", "/adapters/adapter"),)),
        (0, "tenant-a", ADAPTER, (("lora", "adapter", "/adapters/adapter"), ("cache_salt", "tenant-a"))),
        (2, "tenant-a", ADAPTER, (("lora", "adapter", "/adapters/adapter"),)),
    ],
)
def test_extra_keys_put_the_adapter_on_every_block_and_the_salt_on_the_first(
    block_index: int, cache_salt: str | None, lora: LoraKey | None, expected: object
) -> None:
    assert block_extra_keys(block_index, cache_salt=cache_salt, lora=lora) == expected


@pytest.mark.parametrize(
    ("cache_salt", "lora"),
    [(None, None), ("tenant-a", None), (None, ADAPTER), ("tenant-a", ADAPTER)],
)
def test_the_chain_hashes_each_block_on_its_parent_with_its_extra_keys(
    cache_salt: str | None, lora: LoraKey | None
) -> None:
    prompt = list(range(100))
    parent: bytes | None = None
    expected = []
    for index in range(3):
        keys = block_extra_keys(index, cache_salt=cache_salt, lora=lora)
        block = hash_block(parent, prompt[index * 32 : (index + 1) * 32], keys)
        expected.append(block)
        parent = block.digest

    chain = block_hash_chain(prompt, 32, cache_salt=cache_salt, lora=lora)
    assert chain == expected


@pytest.mark.parametrize(("cache_salt", "lora"), [("tenant-a", None), (None, ADAPTER)])
def test_a_salt_or_an_adapter_changes_every_block_of_the_chain(
    cache_salt: str | None, lora: LoraKey | None
) -> None:
    prompt = list(range(96))
    plain = block_hash_chain(prompt, 32)
    keyed = block_hash_chain(prompt, 32, cache_salt=cache_salt, lora=lora)
    assert all(a != b for a, b in zip(plain, keyed, strict=True))


def test_an_empty_salt_is_no_salt() -> None:
    assert block_hash_chain(range(64), 32, cache_salt="") == block_hash_chain(range(64), 32)


def test_token_ids_may_be_numpy_integers() -> None:
    tokens = np.arange(64, dtype=np.int64)
    assert block_hash_chain(tokens, 32) == block_hash_chain(list(range(64)), 32)
    assert hash_block(None, tokens[:32]) == hash_block(None, range(32))  # type: ignore[arg-type]


def test_non_integer_token_ids_are_refused() -> None:
    with pytest.raises(TypeError):
        block_hash_chain([1.0] * 32, 32)  # type: ignore[list-item]


def test_the_wire_value_is_the_last_eight_bytes_big_endian() -> None:
    digest = bytes(24) + bytes.fromhex("0102030405060708")
    assert to_wire(digest) == 0x0102030405060708
    assert BlockHash(digest).wire == 0x0102030405060708


def test_to_wire_refuses_a_digest_shorter_than_eight_bytes() -> None:
    with pytest.raises(ValueError, match="8 bytes"):
        to_wire(bytes(7))


@pytest.mark.parametrize("size", [0, 16, 33])
def test_a_block_hash_holds_a_sha256_digest(size: int) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        BlockHash(bytes(size))


@pytest.mark.parametrize(
    ("wire", "signed"),
    [
        (0, 0),
        (1, 1),
        (2**63 - 1, 2**63 - 1),
        (2**63, -(2**63)),
        (2**64 - 1, -1),
        (17566110917452288811, 17566110917452288811 - 2**64),  # a captured block hash
    ],
)
def test_wire_hashes_map_to_bigint_and_back(wire: int, signed: int) -> None:
    assert wire_to_signed(wire) == signed
    assert signed_to_wire(signed) == wire


@pytest.mark.parametrize("wire", [-1, 2**64])
def test_a_wire_hash_outside_uint64_is_refused(wire: int) -> None:
    with pytest.raises(ValueError, match="uint64"):
        wire_to_signed(wire)


@pytest.mark.parametrize("signed", [-(2**63) - 1, 2**63])
def test_a_stored_hash_outside_int64_is_refused(signed: int) -> None:
    with pytest.raises(ValueError, match="int64"):
        signed_to_wire(signed)


# Where CBOR's encoding of an integer grows (1, 2, 3 and 5 bytes) and PostgreSQL's integer ends.
CBOR_SIZE_EDGES = [0, 1, 23, 24, 255, 256, 65_535, 65_536, 151_935, 2**31 - 1, 2**31, 2**32 - 1]


def _block_by_block(tokens: list[int], block_size: int, **keys: Any) -> list[BlockHash]:
    """The chain of hash_block over each full block: cbor2 encodes every block whole."""
    chain: list[BlockHash] = []
    for index in range(len(tokens) // block_size):
        block = tokens[index * block_size : (index + 1) * block_size]
        chain.append(hash_block(chain[-1].digest if chain else None, block, block_extra_keys(index, **keys)))
    return chain


@pytest.mark.parametrize("length", [0, 31, 32, 100, 16 * 32, 16 * 32 + 5, 8192])
@pytest.mark.parametrize("block_size", [1, 16, 24, 32, 300])  # 24, 300: array heads of 2 and 3 bytes
def test_a_chain_is_its_blocks_hashed_one_by_one_whatever_the_sizes_of_its_token_ids(
    length: int, block_size: int
) -> None:
    rng = random.Random(length * block_size)
    tokens = [
        rng.choice(CBOR_SIZE_EDGES) if rng.random() < 0.3 else rng.randrange(151_936) for _ in range(length)
    ]
    keys: dict[str, Any] = {"cache_salt": "tenant-a", "lora": ADAPTER}

    assert block_hash_chain(tokens, block_size, **keys) == _block_by_block(tokens, block_size, **keys)


@pytest.mark.parametrize("odd", [-1, -24, -(2**31), 2**32, 2**63 - 1, 2**64 - 1, 2**64, 2**70, -(2**64) - 1])
def test_token_ids_no_vocabulary_holds_are_hashed_as_cbor2_encodes_them(odd: int) -> None:
    tokens = [*range(1000), odd, *range(500)]
    assert block_hash_chain(tokens, BLOCK_SIZE) == _block_by_block(tokens, BLOCK_SIZE)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64, np.uint64])
def test_numpy_token_ids_of_any_integer_type_hash_as_python_ints(dtype: type[np.integer[Any]]) -> None:
    tokens = [*range(0, 151_936, 97), 2**31 - 1]
    array: Any = np.array(tokens, dtype=dtype)
    assert block_hash_chain(array, BLOCK_SIZE) == block_hash_chain(tokens, BLOCK_SIZE)


def test_numpy_token_ids_beyond_int64_hash_as_python_ints() -> None:
    tokens = [2**64 - 1, *range(1000)]
    array: Any = np.array(tokens, dtype=np.uint64)
    assert block_hash_chain(array, BLOCK_SIZE) == block_hash_chain(tokens, BLOCK_SIZE)


@pytest.mark.parametrize(
    "tokens", [[*range(1023), 7.0], [*range(1023), "7"], [*range(1023), None], np.ones(1024)], ids=repr
)
def test_a_long_prompt_with_a_non_integer_token_id_is_refused(tokens: Any) -> None:
    with pytest.raises(TypeError):
        block_hash_chain(tokens, BLOCK_SIZE)


@pytest.mark.parametrize("length", [0, 31, 32, 100, 512, 2048])
@pytest.mark.parametrize("largest", [23, 255, 65_535, 151_935, 2**32 - 1, 2**40])
def test_signed_block_hashes_are_the_chains_wire_hashes_as_stored(length: int, largest: int) -> None:
    # The ingest's fast path: whatever the ids' CBOR sizes (numpy's encoding, or cbor2's beyond
    # 2**32), from a list or from int64, salted or not, with an adapter or not.
    rng = random.Random(length * largest)
    tokens = [rng.randrange(largest + 1) for _ in range(length)]
    lora = LoraKey("adapter", "/adapters/a")
    for salt, adapter in [(None, None), ("tenant-a", None), (None, lora), ("tenant-a", lora)]:
        chain = block_hash_chain(tokens, 16, cache_salt=salt, lora=adapter)
        stored = [wire_to_signed(block.wire) for block in chain]
        assert signed_block_hashes(tokens, 16, cache_salt=salt, lora=adapter) == stored
        assert signed_block_hashes(int64_ids(tokens), 16, cache_salt=salt, lora=adapter) == stored


def test_int64_ids_refuse_what_is_not_an_integer_or_beyond_int64() -> None:
    assert int64_ids([1, 2**63 - 1]).tolist() == [1, 2**63 - 1]
    with pytest.raises(TypeError):
        int64_ids([1, 2.0])  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        int64_ids([2**63])
    with pytest.raises(OverflowError):
        int64_ids(np.array([2**63], dtype=np.uint64))
