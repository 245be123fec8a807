"""The divergence engine says where two prompts stop sharing the prefix cache, as vLLM decided it."""

from __future__ import annotations

import random
from dataclasses import fields, replace
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from app.domain.blockhash import block_hash_chain
from app.domain.blocks import cached_tokens_for_full_match
from app.domain.divergence import (
    NOTED_FIELDS,
    REUSE_FIELDS,
    BlockStatus,
    Compatibility,
    Divergence,
    Edit,
    EditKind,
    block_statuses,
    blocked_by,
    compare_prompts,
    match_block_hashes,
    shared_leading_blocks,
    side_blocks,
)
from app.domain.divergence_edits import edit_script
from tests.support.captures import CAPTURED_PAIRS, load_json, stored_block_hashes

BLOCK_SIZE = 32  # the captured server's --block-size
NEWLINE = 198  # "\n" in the captured server's GPT-2 tokenizer
FOREIGN = [50_250, 50_251, 50_252, 50_253, 50_254, 50_255]  # ids no captured prompt uses
RECORD = Compatibility(model="tiny", tokenizer="gpt2-bpe", kv_cache_dtype="auto", hash_algo="sha256_cbor")


def _capture(name: str) -> Any:
    return load_json(f"completion-{name}.json")


def _prompt_ids(name: str) -> list[int]:
    ids: list[int] = _capture(name)["response"]["choices"][0]["prompt_token_ids"]
    return ids


def _record(name: str) -> Compatibility:
    return replace(RECORD, tenant_salt=_capture(name)["request"].get("cache_salt"))


def _compare_captures(first: str, later: str) -> Divergence:
    return compare_prompts(_prompt_ids(first), _prompt_ids(later), BLOCK_SIZE, _record(first), _record(later))


def _compare(a: list[int], b: list[int], block_size: int = BLOCK_SIZE) -> Divergence:
    return compare_prompts(a, b, block_size, RECORD, RECORD)


def _apply(a: list[int], b: list[int], edits: tuple[Edit, ...]) -> list[int]:
    """Rebuild b from a and the edits."""
    rebuilt, position = [], 0
    for edit in edits:
        rebuilt += a[position : edit.a_start] + b[edit.b_start : edit.b_end]
        position = edit.a_end
    return rebuilt + a[position:]


# -- the captured pairs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "later", "blocked_by"),
    CAPTURED_PAIRS,
)
def test_captured_pairs_reuse_the_tokens_vllm_reported(
    first: str, later: str, blocked_by: tuple[str, ...]
) -> None:
    reported = _capture(later)["response"]["usage"]["prompt_tokens_details"]["cached_tokens"]

    divergence = _compare_captures(first, later)

    assert divergence.reusable_tokens == reported
    assert divergence.blocked_by == blocked_by


def test_shared_prefix_pair_reuses_160_tokens_and_diverges_at_the_question() -> None:
    divergence = _compare_captures("shared-prefix-the", "shared-prefix-I")

    assert (divergence.first_divergence, divergence.common_prefix) == (185, 185)
    assert divergence.reusable_tokens == 160
    assert divergence.wasted_prefill_tokens == 0
    assert divergence.edits == (Edit(EditKind.REPLACED, 185, 191, 185, 191),)


def test_timestamp_pair_diverges_in_the_time_line_and_reuses_nothing() -> None:
    header = load_json("tokenize-short.json")["tokens"]  # "Current time: 10:21:32\nRequest ID: 84f82d\n"
    a, b = _prompt_ids("timestamp-top-1"), _prompt_ids("timestamp-top-2")
    time_line_end = header.index(NEWLINE)

    divergence = _compare_captures("timestamp-top-1", "timestamp-top-2")

    assert a[: len(header)] == header
    assert divergence.first_divergence == 7 < time_line_end
    assert divergence.reusable_tokens == 0
    assert divergence.wasted_prefill_tokens == cached_tokens_for_full_match(len(b), BLOCK_SIZE) == 192


def test_timestamp_pair_edit_ends_with_the_header_and_the_system_text_realigns() -> None:
    header = load_json("tokenize-short.json")["tokens"]

    divergence = _compare_captures("timestamp-top-1", "timestamp-top-2")

    assert divergence.edits == (
        Edit(EditKind.REPLACED, 7, 8, 7, 8),  # the seconds of the time
        Edit(EditKind.REPLACED, 12, 16, 12, 15),  # the request id: 4 tokens became 3
    )
    assert divergence.edits_exact
    assert divergence.edits[-1].a_end < len(header)


def test_different_salts_reuse_nothing_and_name_the_salt() -> None:
    divergence = _compare_captures("salt-a-1", "salt-b-1")

    assert divergence.identical
    assert divergence.first_divergence is None
    assert divergence.reusable_tokens == 0
    assert divergence.blocked_by == ("tenant_salt",)
    assert divergence.wasted_prefill_tokens == 160
    assert divergence.shared_blocks == 0


@pytest.mark.parametrize(
    "name",
    [
        "timestamp-top-1",
        "timestamp-top-2",
        "shared-prefix-the",
        "shared-prefix-I",
        "salt-a-1",
        "salt-a-2",
        "salt-b-1",
    ],
)
def test_block_wire_hashes_are_those_the_server_stored(name: str) -> None:
    ids = _prompt_ids(name)
    divergence = compare_prompts(ids, ids, BLOCK_SIZE, _record(name), _record(name))

    blocks = block_statuses(divergence, "a", ids)

    full = [block for block in blocks if block.status is not BlockStatus.PARTIAL_TAIL]
    assert len(full) == len(ids) // BLOCK_SIZE
    assert {block.wire_hash for block in full} <= stored_block_hashes()


def test_shared_blocks_carry_the_same_hash_on_both_sides_and_diverged_ones_do_not() -> None:
    divergence = _compare_captures("shared-prefix-the", "shared-prefix-I")

    a_blocks = block_statuses(divergence, "a", _prompt_ids("shared-prefix-the"))
    b_blocks = block_statuses(divergence, "b", _prompt_ids("shared-prefix-I"))

    assert [block.status for block in b_blocks] == [BlockStatus.SHARED] * 5 + [BlockStatus.DIVERGED]
    assert [a.wire_hash for a in a_blocks[:5]] == [b.wire_hash for b in b_blocks[:5]]
    assert a_blocks[5].wire_hash != b_blocks[5].wire_hash


def test_blocks_of_another_salt_are_all_diverged_with_other_hashes() -> None:
    divergence = _compare_captures("salt-a-1", "salt-b-1")

    a_blocks = block_statuses(divergence, "a", _prompt_ids("salt-a-1"))
    b_blocks = block_statuses(divergence, "b", _prompt_ids("salt-b-1"))

    assert {block.status for block in b_blocks[:-1]} == {BlockStatus.DIVERGED}
    assert not {block.wire_hash for block in a_blocks} & {block.wire_hash for block in b_blocks[:-1]}


def test_side_blocks_carry_the_given_hashes_and_the_statuses_block_statuses_gives() -> None:
    b = [*range(70), -1, *range(71, 100)]
    divergence = _compare(list(range(100)), b)

    blocks = side_blocks(divergence, "b", [11, 22])

    assert [block.wire_hash for block in blocks] == [11, 22, None, None]  # none given, and the tail
    assert [block.status for block in blocks] == [
        block.status for block in block_statuses(divergence, "b", b)
    ]


# -- hash-only records -------------------------------------------------------------------


def _chain(name: str) -> list[int]:
    salt = _capture(name)["request"].get("cache_salt")
    return [block.wire for block in block_hash_chain(_prompt_ids(name), BLOCK_SIZE, cache_salt=salt)]


@pytest.mark.parametrize(("first", "later", "blocked"), CAPTURED_PAIRS)
def test_block_hashes_alone_give_the_reuse_vllm_reported(
    first: str, later: str, blocked: tuple[str, ...]
) -> None:
    reported = _capture(later)["response"]["usage"]["prompt_tokens_details"]["cached_tokens"]

    match = match_block_hashes(
        _chain(first),
        _chain(later),
        a_length=len(_prompt_ids(first)),
        b_length=len(_prompt_ids(later)),
        block_size=BLOCK_SIZE,
        a_compatibility=_record(first),
        b_compatibility=_record(later),
    )

    assert match.reusable_tokens == reported
    assert match.blocked_by == blocked


def test_block_hashes_alone_place_the_divergence_in_its_block() -> None:
    match = match_block_hashes(
        [1, 2, 3, 4, 5, 6],
        [1, 2, 3, 4, 5],
        a_length=192,
        b_length=191,
        block_size=32,
        a_compatibility=RECORD,
        b_compatibility=RECORD,
    )

    assert (match.matching_blocks, match.reusable_tokens, match.first_divergent_block) == (5, 160, 5)


@pytest.mark.parametrize(
    ("first", "later", "shared"),
    [
        ("shared-prefix-the", "shared-prefix-I", 5),  # the system text, then the question
        ("salt-a-1", "salt-a-2", 5),
        ("salt-a-1", "salt-b-1", 0),  # the same tokens: the salt is in every hash
        ("timestamp-top-1", "timestamp-top-2", 0),  # the time is in block 0
    ],
)
def test_leading_blocks_are_shared_while_the_chains_agree(first: str, later: str, shared: int) -> None:
    assert shared_leading_blocks(_chain(first), _chain(later)) == shared
    assert shared_leading_blocks(_chain(first), []) == 0


# -- compatibility records ---------------------------------------------------------------


def test_every_compatibility_field_either_blocks_reuse_or_is_noted() -> None:
    names = [field.name for field in fields(Compatibility)]

    assert sorted(names) == sorted([*REUSE_FIELDS, *NOTED_FIELDS])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", "tiny-2"),
        ("lora_adapter", "support-lora"),
        ("tenant_salt", "tenant-a"),
        ("kv_cache_dtype", "fp8"),
        ("hash_algo", "sha256"),
    ],
)
def test_a_field_that_changes_cached_activations_zeroes_reuse_and_is_named(field: str, value: str) -> None:
    ids = _prompt_ids("shared-prefix-the")

    divergence = compare_prompts(ids, ids, BLOCK_SIZE, RECORD, replace(RECORD, **{field: value}))

    assert divergence.reusable_tokens == 0
    assert divergence.blocked_by == (field,)
    assert divergence.wasted_prefill_tokens == 160


@pytest.mark.parametrize(
    ("field", "value"),
    [("tokenizer", "llama-3"), ("template", "support-v2"), ("template_version", "abc123")],
)
def test_a_tokenizer_or_template_difference_is_a_note_not_a_miss(field: str, value: str) -> None:
    ids = _prompt_ids("shared-prefix-the")

    divergence = compare_prompts(ids, ids, BLOCK_SIZE, RECORD, replace(RECORD, **{field: value}))

    assert divergence.reusable_tokens == 160
    assert divergence.blocked_by == ()
    assert [note.split()[0] for note in divergence.notes] == [field]


def test_an_empty_salt_is_no_salt() -> None:
    ids = _prompt_ids("shared-prefix-the")

    divergence = compare_prompts(ids, ids, BLOCK_SIZE, RECORD, replace(RECORD, tenant_salt=""))

    assert divergence.blocked_by == ()
    assert blocked_by(replace(RECORD, tenant_salt=None), replace(RECORD, tenant_salt="")) == ()


def test_all_differing_activation_fields_are_named_in_order() -> None:
    other = replace(RECORD, model="other", tenant_salt="x", hash_algo="xxhash")

    divergence = compare_prompts([1, 2, 3], [1, 2, 3], 1, RECORD, other)

    assert divergence.blocked_by == ("model", "tenant_salt", "hash_algo")


def test_a_lora_adapter_changes_every_block_hash() -> None:
    ids = _prompt_ids("shared-prefix-the")
    adapted = replace(RECORD, lora_adapter="support-lora", lora_path="lora-adapter")
    divergence = compare_prompts(ids, ids, BLOCK_SIZE, RECORD, adapted)

    a_blocks = block_statuses(divergence, "a", ids)
    b_blocks = block_statuses(divergence, "b", ids)

    assert all(a.wire_hash != b.wire_hash for a, b in zip(a_blocks, b_blocks, strict=True))


def test_blocks_hashed_with_another_algorithm_have_no_wire_hash() -> None:
    pickled = replace(RECORD, hash_algo="sha256")
    divergence = compare_prompts(list(range(64)), list(range(64)), BLOCK_SIZE, pickled, pickled)

    assert [block.wire_hash for block in block_statuses(divergence, "a", list(range(64)))] == [None, None]


# -- edits -------------------------------------------------------------------------------


@pytest.mark.parametrize("position", [0, 4, 40, 100, 185])
def test_an_inserted_span_is_reported_at_its_index_with_its_length(position: int) -> None:
    a = _prompt_ids("shared-prefix-the")
    b = a[:position] + FOREIGN + a[position:]

    divergence = _compare(a, b)

    assert divergence.first_divergence == position
    assert divergence.edits == (Edit(EditKind.INSERTED, position, position, position, position + 6),)
    assert divergence.reusable_tokens == position // BLOCK_SIZE * BLOCK_SIZE


def test_an_inserted_timestamp_is_an_insertion_even_when_its_last_token_repeats_the_next_one() -> None:
    a = _prompt_ids("shared-prefix-the")
    inserted = [*FOREIGN[:5], a[4]]  # the last inserted token equals the token it lands before
    b = a[:4] + inserted + a[4:]

    divergence = _compare(a, b)

    assert divergence.edits == (Edit(EditKind.INSERTED, 4, 4, 4, 10),)


def test_a_deleted_span_is_reported_at_its_index_with_its_length() -> None:
    a = _prompt_ids("shared-prefix-the")
    b = a[:20] + a[28:]

    divergence = _compare(a, b)

    assert divergence.edits == (Edit(EditKind.DELETED, 20, 28, 20, 20),)


def test_an_edit_at_the_top_and_another_at_the_end_are_two_spans() -> None:
    a = _prompt_ids("shared-prefix-the") * 40  # 7,680 tokens
    b = a[:10] + FOREIGN[:2] + a[12:-3] + FOREIGN[:4]

    divergence = _compare(a, b)

    assert divergence.edits == (
        Edit(EditKind.REPLACED, 10, 12, 10, 12),
        Edit(EditKind.REPLACED, len(a) - 3, len(a), len(b) - 4, len(b)),
    )


def test_prompts_differing_past_the_bound_get_one_replaced_span_and_a_note() -> None:
    a = _prompt_ids("shared-prefix-the")
    b = [*a[:10], *reversed(a[10:])]

    divergence = compare_prompts(a, b, BLOCK_SIZE, RECORD, RECORD, max_edit_distance=8)

    assert not divergence.edits_exact
    assert divergence.edits == (Edit(EditKind.REPLACED, 10, len(a), 10, len(b)),)
    assert "more than 8" in divergence.notes[-1]


@pytest.mark.parametrize("seed", range(8))
def test_edits_rebuild_the_later_prompt_from_the_first(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 20))]
        b = [rng.randrange(4) for _ in range(rng.randrange(0, 20))]

        script = edit_script(np.array(a, dtype=np.int64), np.array(b, dtype=np.int64))

        assert script.exact
        assert _apply(a, b, script.edits) == b
        assert all(later.a_start > edit.a_end for edit, later in pairwise(script.edits))


# -- lengths, prefixes and block sizes ---------------------------------------------------


def test_identical_prompts_have_no_divergence_and_reuse_all_but_the_last_token() -> None:
    ids = _prompt_ids("shared-prefix-the")

    divergence = _compare(ids, ids)

    assert divergence.first_divergence is None
    assert divergence.common_prefix == len(ids)
    assert divergence.edits == ()
    assert divergence.reusable_tokens == 160
    assert divergence.wasted_prefill_tokens == 0


@pytest.mark.parametrize(
    ("a", "b", "first", "edits"),
    [
        ([], [], None, ()),
        ([], [5, 6], 0, (Edit(EditKind.INSERTED, 0, 0, 0, 2),)),
        ([5, 6], [], 0, (Edit(EditKind.DELETED, 0, 2, 0, 0),)),
    ],
)
def test_empty_prompts_reuse_nothing(
    a: list[int], b: list[int], first: int | None, edits: tuple[Edit, ...]
) -> None:
    divergence = _compare(a, b, block_size=1)

    assert (divergence.first_divergence, divergence.common_prefix) == (first, 0)
    assert divergence.edits == edits
    assert (divergence.reusable_tokens, divergence.wasted_prefill_tokens) == (0, 0)


def test_a_later_prompt_extending_the_first_diverges_where_the_first_ends() -> None:
    ids = _prompt_ids("shared-prefix-the")

    divergence = _compare(ids[:100], ids)

    assert divergence.first_divergence == 100
    assert divergence.edits == (Edit(EditKind.INSERTED, 100, 100, 100, len(ids)),)
    assert divergence.reusable_tokens == 96  # the first prompt's three full blocks
    assert divergence.wasted_prefill_tokens == 0  # nothing more could have been cached


def test_a_later_prompt_cut_short_diverges_where_it_ends() -> None:
    ids = _prompt_ids("shared-prefix-the")

    divergence = _compare(ids, ids[:100])

    assert divergence.first_divergence == 100
    assert divergence.edits == (Edit(EditKind.DELETED, 100, len(ids), 100, 100),)
    assert divergence.reusable_tokens == 96
    assert divergence.wasted_prefill_tokens == 0


@pytest.mark.parametrize(
    ("length", "block_size", "reusable"),
    [
        (64, 32, 32),  # a whole number of blocks: the last token is recomputed, one block fewer
        (65, 32, 64),
        (32, 32, 0),
        (33, 32, 32),
        (31, 32, 0),
        (1, 32, 0),
        (16, 1, 15),
    ],
)
def test_identical_prompts_reuse_whole_blocks_short_of_the_last_token(
    length: int, block_size: int, reusable: int
) -> None:
    ids = list(range(length))

    divergence = _compare(ids, ids, block_size)

    assert divergence.reusable_tokens == reusable


def test_a_divergence_inside_a_block_loses_that_whole_block() -> None:
    a = list(range(100))
    b = [*a[:63], -1, *a[64:]]

    divergence = _compare(a, b)

    assert divergence.common_prefix == 63
    assert divergence.reusable_tokens == 32
    assert divergence.wasted_prefill_tokens == 96 - 32


def test_blocks_are_shared_up_to_the_divergence_then_diverged_then_a_partial_tail() -> None:
    a = list(range(100))
    b = [*a[:70], -1, *a[71:]]
    divergence = _compare(a, b)

    blocks = block_statuses(divergence, "b", b)

    assert [(block.index, block.start, block.end, block.status) for block in blocks] == [
        (0, 0, 32, BlockStatus.SHARED),
        (1, 32, 64, BlockStatus.SHARED),
        (2, 64, 96, BlockStatus.DIVERGED),
        (3, 96, 100, BlockStatus.PARTIAL_TAIL),
    ]
    assert blocks[-1].wire_hash is None


def test_a_prompt_of_whole_blocks_has_no_partial_tail_but_reuses_one_block_fewer() -> None:
    ids = list(range(64))
    divergence = _compare(ids, ids)

    blocks = block_statuses(divergence, "b", ids)

    assert [block.status for block in blocks] == [BlockStatus.SHARED, BlockStatus.SHARED]
    assert divergence.reusable_tokens == 32


# -- inputs ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32])
def test_numpy_arrays_compare_like_lists(dtype: type[np.integer[Any]]) -> None:
    a, b = _prompt_ids("timestamp-top-1"), _prompt_ids("timestamp-top-2")

    from_arrays = compare_prompts(
        np.array(a, dtype=dtype), np.array(b, dtype=dtype), BLOCK_SIZE, RECORD, RECORD
    )

    assert from_arrays == _compare(a, b)


@pytest.mark.parametrize(
    ("tokens", "error"),
    [
        ([1.5, 2.0], TypeError),
        (["1", "2"], TypeError),
        (np.array([1.5, 2.0]), TypeError),
        (np.array([[1, 2]]), ValueError),
    ],
)
def test_token_ids_that_are_not_a_row_of_integers_are_refused(tokens: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        compare_prompts(tokens, [1, 2], BLOCK_SIZE, RECORD, RECORD)


def test_a_block_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="block_size"):
        compare_prompts([1], [1], 0, RECORD, RECORD)


def test_block_statuses_refuse_tokens_of_another_length() -> None:
    divergence = _compare([1, 2, 3], [1, 2])

    with pytest.raises(ValueError, match="side b has 2 tokens"):
        block_statuses(divergence, "b", [1, 2, 3])


def test_an_adapter_whose_path_is_unknown_has_no_wire_hash() -> None:
    # vLLM hashes the adapter's name and path: without the path no block hash can be reproduced.
    named = replace(RECORD, lora_adapter="support-lora")
    divergence = compare_prompts(list(range(64)), list(range(64)), BLOCK_SIZE, named, named)

    assert [block.wire_hash for block in block_statuses(divergence, "a", list(range(64)))] == [None, None]
