"""The analyzer on several cores (app/analyzer/work.py, parts.py, the parts of readers.py) gives the
report it gives on one."""

import json
import random
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest

from app.analyzer import parts, readers
from app.analyzer.cli import main
from app.analyzer.diagnose import Diagnosed, diagnose_part, diagnose_trace
from app.analyzer.parts import independent_parts
from app.analyzer.readers import read_trace
from app.analyzer.trace import build_requests
from app.domain.misses import Cause, Diagnosis

SIZE = 16


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["analyze", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(1, 50_000) for _ in range(count)]


@pytest.fixture(scope="module")
def mixed_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prefixscope's export format with token ids, on two servers: templates t1 and t2 open with
    the same system prompt, and so do half the requests without a template; t3 has its own; t4's
    two tenants salt the same text; t5 gains a volatile token at 20 halfway through. Malformed
    lines sit among them."""
    rng = random.Random(7)
    system = _tokens(rng, 64)
    own = {template: _tokens(rng, 48) for template in ("t1", "t2", "t3", "t4", "t5", "")}
    prefixes = {"t1": system + own["t1"], "t2": system + own["t2"], "t3": own["t3"] * 2,
                "t4": own["t4"] * 2, "t5": own["t5"] * 2}  # fmt: skip
    lines = []
    for n in range(360):
        template = ("t1", "t2", "t3", "t4", "t5", "")[n % 6]
        salt = ("s1", "s2")[n % 4 // 2] if template == "t4" else ""
        opening = system if n % 12 == 5 else _tokens(rng, 40)  # of a request without a template
        prompt = list(prefixes[template]) if template else opening
        if template == "t5" and n >= 180:
            prompt = [*prompt[:20], rng.randrange(1, 50_000), *prompt[20:]]
        prompt = [*prompt, *_tokens(rng, rng.randrange(20, 80))]
        line = {"request_id": f"r{n}", "arrived": 1_767_225_600 + n * 0.5, "prompt_tokens": len(prompt),
                "server": ("a", "b")[n % 5 % 2], "group": "m", "salt": salt, "tenant": salt,
                "template": template, "output_tokens": 30, "token_ids": prompt}  # fmt: skip
        lines.append(msgspec.json.encode(line))
        if n % 90 == 45:
            lines += [b"{not json", b'{"request_id": "no arrival", "token_ids": [1]}']
    path = tmp_path_factory.mktemp("trace") / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_parts_read_as_the_whole_file(mixed_trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = read_trace(mixed_trace, align=64)
    monkeypatch.setattr(readers, "PART_BYTES_LEAST", 1)
    split = read_trace(mixed_trace, align=64, jobs=3)
    assert len(whole.lines) == 360 and whole.skipped  # each part has malformed lines to count
    assert split.lines == whole.lines
    assert split.tokens.tolist() == whole.tokens.tolist()
    assert split.skipped == whole.skipped


def test_a_failed_read_leaves_no_token_ids_behind(
    mixed_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The later parts spill their token ids (prompt content) to temporary files: when the first
    part's reading fails, the others' files are deleted all the same."""
    monkeypatch.setattr(readers, "PART_BYTES_LEAST", 1)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    read_part = readers._read_part

    def first_part_fails(path: Path, format: str, align: int, start: int, *rest: Any) -> Any:
        if start == 0:
            raise OSError("the disk went away")
        return read_part(path, format, align, start, *rest)

    monkeypatch.setattr(readers, "_read_part", first_part_fails)
    with pytest.raises(OSError, match="went away"):
        read_trace(mixed_trace, jobs=3)
    assert not list(tmp_path.glob("prefixscope-tokens-*"))
    monkeypatch.setattr(readers, "_read_part", read_part)
    assert len(read_trace(mixed_trace, jobs=3).lines) == 360  # the same parts, read well


def test_requests_sharing_a_first_block_or_a_template_are_one_part(mixed_trace: Path) -> None:
    built = build_requests(read_trace(mixed_trace), SIZE)
    found = independent_parts(built.requests, 8)
    templates = sorted(sorted({built.requests[i].template for i in part}) for part in found)
    # t1 and t2 share a system prompt with some requests of no template, the family of all of those.
    assert templates == [["", "t1", "t2"], ["t3"], ["t4"], ["t5"]]
    assert all(part == sorted(part) for part in found)
    assert sorted(i for part in found for i in part) == list(range(len(built.requests)))
    assert [len(part) for part in independent_parts(built.requests, 2)] == [180, 180]  # t3 to t5 beside


def test_independent_parts_diagnose_as_the_whole_trace(
    mixed_trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = build_requests(read_trace(mixed_trace), SIZE)
    whole = diagnose_trace(built, blocks=None)  # one history, every request in turn

    def by_parts() -> Diagnosed:
        """Each part's requests' diagnoses in their place in the trace; the blocks stored, summed."""
        diagnoses: list[Any] = [None] * len(whole.diagnoses)  # None where no part diagnosed it
        replayed, stored = [0] * len(whole.replayed), [0] * len(whole.stored)
        for part in independent_parts(built.requests, 64):
            found = diagnose_part(built, part)
            for index, diagnosis, reused in zip(part, found.diagnoses, found.replayed, strict=True):
                diagnoses[index], replayed[index] = diagnosis, reused
            stored = [mine + theirs for mine, theirs in zip(stored, found.stored, strict=True)]
        return Diagnosed(diagnoses, replayed, stored)

    assert by_parts() == whole
    causes = {d.cause for d in whole.diagnoses if isinstance(d, Diagnosis)}
    assert {Cause.PROMPT_CHANGED, Cause.SALT, Cause.COLD, Cause.ROUTED_ELSEWHERE} <= causes
    # The parts matter: split by template alone, t2's system prompt reads as never seen before.
    monkeypatch.setattr(parts, "_keys", lambda request: [request.template])
    assert by_parts() != whole


def test_several_cores_give_the_report_of_one(
    mixed_trace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    one = _report(capsys, str(mixed_trace), "--jobs", "1")
    monkeypatch.setattr(readers, "PART_BYTES_LEAST", 1)
    assert _report(capsys, str(mixed_trace), "--jobs", "3") == one
    assert one["killers"] and one["curve"] and len(one["causes"]) > 4


def test_with_a_capacity_the_trace_is_diagnosed_whole(
    mixed_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _report(capsys, str(mixed_trace), "--jobs", "1", "--blocks", "40")
    assert _report(capsys, str(mixed_trace), "--jobs", "2", "--blocks", "40") == one
    assert any(row["cause"] == "evicted" for row in one["causes"])
