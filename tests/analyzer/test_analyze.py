"""The offline analyzer end to end through its command's main(): no database."""

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.analyzer.cli import main
from bench.analysis_trace import VOLATILE, VOLATILE_AT, write_traces
from tests.support.captures import captured_traffic


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["analyze", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def gen_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trace")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    paths, _ = write_traces(folder, requests=400, block_sizes=[16], start=start, seconds=600)
    return paths[16]


def test_gen_trace_killers_are_the_volatile_templates_token(
    gen_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report(capsys, str(gen_trace))
    assert report["format"] == "prefixlens" and report["requests"] == 400
    killers = {(k["group"]["name"], k["killer"]["position_token"]) for k in report["killers"]}
    assert killers == {(f"template-{t}", VOLATILE_AT) for t in VOLATILE}
    # An unlimited replay reuses what the trace's unlimited cache reused.
    assert report["replayed_tokens"] == report["reported_tokens"]
    assert {g["group"]["name"] for g in report["groups"]} == {f"template-{t}" for t in range(8)}
    assert [p["multiplier"] for p in report["curve"]] == sorted(p["multiplier"] for p in report["curve"])


def test_malformed_lines_are_skipped_and_counted(
    gen_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = gen_trace.read_bytes().splitlines()[:20]
    bad = [b"{not json", b"[1, 2]", b'{"token_ids": "abc"}', b'{"token_ids": [-1, 2]}', b'{"token_ids": []}',
           b'{"token_ids": [1, 2.5]}', b'{"request_id": "x"}']  # fmt: skip
    trace = tmp_path / "mixed.jsonl"
    trace.write_bytes(b"\n".join([good[0], *bad, *good[1:]]) + b"\n")
    report = _report(capsys, str(trace), "--no-curve")
    assert report["requests"] == 20
    assert report["skipped"] == {"invalid_json": 1, "not_an_object": 1, "bad_field": 3, "empty_prompt": 1,
                                 "no_prompt": 1}  # fmt: skip


def _capture_log(path: Path) -> None:
    """The real vLLM captures' traffic as an OpenAI-style request log, in traffic order: request
    bodies (their prompt text, tokenized by the analyzer with GPT-2's tokenizer, the tiny model's)
    and the cached tokens vLLM reported."""
    lines = []
    for n, (body, cached) in enumerate(captured_traffic()):
        usage = {
            "completion_tokens": body.get("max_tokens", 0),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        lines.append({"request": body, "response": {"id": f"r{n}", "usage": usage}, "timestamp": n,
                      "server": "vllm-cpu"})  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_real_captures_replayed_at_their_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "captures.jsonl"
    _capture_log(trace)
    report = _report(capsys, str(trace), "--blocks", "48", "--block-size", "32")
    assert report["format"] == "openai-log"
    rows = report["rows"]
    # The server held 48 blocks of 32 tokens: the replay reuses what vLLM reported, request by request.
    assert [r["replayed_tokens"] for r in rows] == [r["cached_tokens"] for r in rows]
    causes = {r["request_id"]: r["cause"] for r in rows}
    assert causes[f"r{len(rows) - 1}"] == "evicted"  # the shared prefix after six documents evicted it
    assert causes["r6"] == "salt"  # tenant-b's first request: tenant-a's blocks under another salt


@pytest.mark.parametrize(
    "line",
    [
        {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]},
        {"prompt": "You are terse. hi"},
        {
            "id": "c1",
            "conversations": [
                {"from": "human", "value": "hi"},
                {"from": "gpt", "value": "yo"},
                {"from": "human", "value": "again"},
            ],
        },
    ],
)
def test_kvlint_inputs_are_tokenized_and_said_so(
    line: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "kvlint.jsonl"
    trace.write_text(json.dumps(line) + "\n")
    report = _report(capsys, str(trace), "--no-curve")
    assert report["format"] == "kvlint" and report["requests"] >= 1
    assert any("bundled GPT-2 tokenizer" in note for note in report["notes"])


def test_terminal_summary_and_html(
    gen_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(gen_trace), "--no-curve"]) == 0
    assert "cache killers" in capsys.readouterr().out
    page = tmp_path / "report.html"
    assert main(["analyze", str(gen_trace), "--html", str(page)]) == 0
    html = page.read_text()
    assert "<svg" in html and "template-2" in html and "<script" not in html


def test_a_trace_with_no_request_says_so_instead_of_empty_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "junk.jsonl"
    trace.write_bytes(b"{not json\n[1, 2]\n")
    assert main(["analyze", str(trace)]) == 0
    summary = capsys.readouterr().out
    assert "nothing to analyze" in summary and "what-if" not in summary and "cache killers" not in summary
    report = _report(capsys, str(trace))
    assert report["requests"] == 0 and report["curve"] == []
    assert report["skipped"] == {"invalid_json": 1, "not_an_object": 1}
    page = tmp_path / "report.html"
    assert main(["analyze", str(trace), "--html", str(page)]) == 0
    html = page.read_text()
    assert "nothing to analyze" in html and "invalid_json 1" in html and "Cache killers" not in html
