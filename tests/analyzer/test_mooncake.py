"""Mooncake's traces (hash ids of 512-token blocks, no token ids), on 300 lines of a real one: the
replay reuses what a plain count over the ids says an unlimited vLLM cache would, and bad lines are
counted without losing the good ones around them."""

import json
from pathlib import Path
from typing import Any

import pytest

from app.analyzer.cli import main
from app.analyzer.readers import read_trace
from app.domain.misses import reusable_blocks

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "mooncake" / "conversation_trace.head-300.jsonl"
BLOCK = 512


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["analyze", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _reused_by_an_unlimited_cache(lines: list[dict[str, Any]]) -> int:
    """Tokens an unlimited vLLM cache reuses, counted over the ids in arrival order (file order
    among equal times): a prompt's leading run of full blocks stored before it, never the block
    holding its last token."""
    stored: set[int] = set()
    reused = 0
    for line in sorted(lines, key=lambda line: line["timestamp"]):
        full = line["hash_ids"][: line["input_length"] // BLOCK]
        run = 0
        while run < min(len(full), reusable_blocks(line["input_length"], BLOCK)) and full[run] in stored:
            run += 1
        reused += run * BLOCK
        stored.update(full)
    return reused


def test_a_real_trace_is_read_block_exact_at_512_tokens() -> None:
    raw = [json.loads(line) for line in TRACE.read_text().splitlines()]
    read = read_trace(TRACE)
    assert read.format == "mooncake" and len(read.lines) == 300 and not read.skipped
    for line, item in zip(read.lines, raw, strict=True):
        assert line.block_size == BLOCK and line.prompt_tokens == item["input_length"]
        assert (
            list(line.block_hashes) == item["hash_ids"][: item["input_length"] // BLOCK]
        )  # no partial block
        assert line.arrived == item["timestamp"] / 1000 and line.output_tokens == item["output_length"]
        assert line.tokens is None


def test_the_replay_reuses_what_the_ids_say_an_unlimited_cache_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    raw = [json.loads(line) for line in TRACE.read_text().splitlines()]
    report = _report(capsys, str(TRACE))
    assert report["format"] == "mooncake" and report["block_size"] == BLOCK and report["requests"] == 300
    assert report["prompt_tokens"] == sum(line["input_length"] for line in raw)
    assert report["replayed_tokens"] == _reused_by_an_unlimited_cache(raw) > 0
    assert report["reported_tokens"] is None  # the trace says nothing of what an engine reused
    # Every request's lost tokens have a cause; all of them add up to what was not reused.
    lost = sum(row["tokens"] for row in report["causes"])
    assert lost == report["prompt_tokens"] - report["replayed_tokens"]


def test_a_small_capacity_reuses_less_and_never_more(capsys: pytest.CaptureFixture[str]) -> None:
    unlimited = _report(capsys, str(TRACE), "--no-curve")
    small = _report(capsys, str(TRACE), "--no-curve", "--blocks", "64")
    assert 0 < small["replayed_tokens"] < unlimited["replayed_tokens"]
    assert any(row["cause"] == "evicted" for row in small["causes"])


def test_bad_lines_are_counted_and_the_good_ones_around_them_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = TRACE.read_text().splitlines()[:10]
    bad = [
        '{"timestamp": 1, "output_length": 3, "hash_ids": [0, 1]}',  # no input_length
        '{"timestamp": 1, "input_length": 1200, "hash_ids": "0,1"}',
        '{"timestamp": 1, "input_length": 1200, "hash_ids": [0]}',  # fewer ids than its 2 full blocks
        '{"timestamp": 1, "input_length": 1200, "hash_ids": [0, -1, 2]}',
        '{"timestamp": -5, "input_length": 600, "hash_ids": [0, 1]}',
        '{"timestamp": 1, "input_length": 0, "hash_ids": []}',
    ]
    trace = tmp_path / "mixed.jsonl"
    trace.write_text("\n".join([good[0], *bad, *good[1:]]) + "\n")
    report = _report(capsys, str(trace), "--no-curve")
    assert report["requests"] == 10
    assert report["skipped"] == {"no_prompt": 1, "bad_field": 4, "empty_prompt": 1}
