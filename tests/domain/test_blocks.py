"""Block rounding matches the cached-token counts a real vLLM server reported."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from app.domain.blocks import (
    blocks_to_reserve,
    cached_tokens_for_full_match,
    full_blocks,
    reusable_tokens,
)
from tests.support.captures import VLLM_CPU_FIXTURES, load_json

BLOCK_SIZE = 32  # the captured server's --block-size


@pytest.mark.parametrize(
    ("tokens", "block_size", "blocks"),
    [(0, 32, 0), (31, 32, 0), (32, 32, 1), (191, 32, 5), (192, 32, 6), (7, 1, 7)],
)
def test_full_blocks_round_down(tokens: int, block_size: int, blocks: int) -> None:
    assert full_blocks(tokens, block_size) == blocks


@pytest.mark.parametrize(
    ("tokens", "block_size", "blocks"),
    [(0, 32, 0), (1, 32, 1), (32, 32, 1), (33, 32, 2), (191, 32, 6), (7, 1, 7)],
)
def test_blocks_to_reserve_round_up(tokens: int, block_size: int, blocks: int) -> None:
    assert blocks_to_reserve(tokens, block_size) == blocks


@pytest.mark.parametrize(
    ("matched", "prompt", "block_size", "reusable"),
    [
        (0, 191, 32, 0),
        (31, 191, 32, 0),
        (32, 191, 32, 32),
        (185, 192, 32, 160),
        (191, 191, 32, 160),
        (192, 192, 32, 160),  # the last token is recomputed, so the sixth block is not reused
        (193, 193, 32, 192),
        (500, 191, 32, 160),  # a match longer than the prompt counts as the whole prompt
        (32, 32, 16, 16),
        (0, 0, 32, 0),
        (1, 1, 32, 0),
    ],
)
def test_reusable_tokens_are_whole_blocks_short_of_the_last_token(
    matched: int, prompt: int, block_size: int, reusable: int
) -> None:
    assert reusable_tokens(matched, prompt, block_size) == reusable


@pytest.mark.parametrize(
    ("prompt", "block_size", "cached"),
    [(191, 32, 160), (192, 32, 160), (193, 32, 192), (32, 16, 16), (1, 32, 0), (0, 32, 0)],
)
def test_a_full_match_caches_all_blocks_before_the_last_token(
    prompt: int, block_size: int, cached: int
) -> None:
    assert cached_tokens_for_full_match(prompt, block_size) == cached


@pytest.mark.parametrize(
    "call",
    [
        lambda: full_blocks(10, 0),
        lambda: full_blocks(-1, 32),
        lambda: blocks_to_reserve(10, -32),
        lambda: blocks_to_reserve(-1, 32),
        lambda: reusable_tokens(-1, 10, 32),
        lambda: reusable_tokens(5, -1, 32),
        lambda: reusable_tokens(5, 10, 0),
        lambda: cached_tokens_for_full_match(-1, 32),
        lambda: cached_tokens_for_full_match(10, 0),
    ],
)
def test_negative_counts_and_non_positive_block_sizes_are_refused(
    call: Callable[[], int],
) -> None:
    with pytest.raises(ValueError):
        call()


def _prompt_ids(name: str) -> list[int]:
    ids: list[int] = load_json(f"completion-{name}.json")["response"]["choices"][0]["prompt_token_ids"]
    return ids


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _stream_usage() -> tuple[list[int], dict[str, Any]]:
    """The streamed completion's prompt ids (first chunk) and usage (last chunk)."""
    text = (VLLM_CPU_FIXTURES / "completion-stream.sse.txt").read_text(encoding="utf-8")
    chunks = [
        json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: {")
    ]
    return chunks[0]["choices"][0]["prompt_token_ids"], chunks[-1]["usage"]


BASE = "base"  # the shared-prefix prompt of the first request (tokenize-prompt.json)


def _reference_ids(name: str) -> list[int]:
    ids: list[int] = load_json("tokenize-prompt.json")["tokens"] if name == BASE else _prompt_ids(name)
    return ids


# Each request, and the earlier prompt whose blocks were resident under the same salt
# when it arrived (None: nothing was: a new salt, or the prefix had been evicted).
RESIDENT_REFERENCE = [
    ("shared-prefix-the", BASE),
    ("shared-prefix-I", BASE),
    ("with-request-id", BASE),
    ("salt-a-1", None),
    ("salt-a-2", "salt-a-1"),
    ("salt-b-1", None),
    ("timestamp-top-1", BASE),  # a volatile first line: no common prefix at all
    ("timestamp-top-2", "timestamp-top-1"),  # common prefix shorter than one block
    ("report-full", BASE),
    ("evict-0", BASE),
    *((f"evict-{i}", f"evict-{i - 1}") for i in range(1, 6)),
    ("shared-prefix-after-evictions", None),
]


@pytest.mark.parametrize(("name", "reference"), RESIDENT_REFERENCE)
def test_reported_cached_tokens_are_the_block_rounded_matched_prefix(
    name: str, reference: str | None
) -> None:
    prompt = _prompt_ids(name)
    usage = load_json(f"completion-{name}.json")["response"]["usage"]
    logged = [entry for entry in load_json("traffic-log.json") if entry["name"] == name][-1]
    matched = 0 if reference is None else _common_prefix(prompt, _reference_ids(reference))

    expected = reusable_tokens(matched, len(prompt), BLOCK_SIZE)
    assert usage["prompt_tokens_details"]["cached_tokens"] == expected
    assert (logged["prompt_tokens"], logged["cached"]) == (len(prompt), expected)


def test_the_first_request_found_nothing_cached() -> None:
    first = load_json("traffic-log.json")[0]
    assert first["cached"] == 0
    assert first["prompt_tokens"] == len(load_json("tokenize-prompt.json")["tokens"])


@pytest.mark.parametrize("name", ["report-full", "stream"])
def test_a_repeated_prompt_caches_all_blocks_before_its_last_token(name: str) -> None:
    if name == "stream":
        prompt, usage = _stream_usage()
    else:
        prompt = _prompt_ids(name)
        usage = load_json(f"completion-{name}.json")["response"]["usage"]

    assert prompt == _reference_ids(BASE)
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached == cached_tokens_for_full_match(len(prompt), BLOCK_SIZE) == 160
