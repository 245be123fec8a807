"""A prefixlens trace's token ids read in C (app/domain/_chain.c json_token_ids) give what the
Python reading of the whole line gives: the same lines, token buffer and skipped lines."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.analyzer import lines as lines_module
from app.analyzer import readers
from app.analyzer.lines import Lines
from bench.analysis_trace import write_traces

# Lines the C reader hands back to Python (None) or that are not plain: each must be read, or
# skipped, as the whole line decoded in Python reads it.
ODD_LINES = [
    b'{"token_ids": [1, 2.5]}', b'{"token_ids": [1e3, 2]}', b'{"token_ids": [-1, 2]}', b'{"token_ids": [-0]}',
    b'{"token_ids": [2147483647, 0]}', b'{"token_ids": [2147483648]}', b'{"token_ids": [true, 3]}',
    b'{"token_ids": []}', b'{"token_ids": null}', b'{"token_ids": "abc"}', b'{"token_ids": [[1]]}',
    b'{"token_ids": [ 7 ,\t8\r\n, 9 ] , "request_id": "spaced"}', b'{"token_ids": {"a": 1}}',
    b'{"token_ids": [5], "token_ids": [6, 7], "tags": {"template": "dup"}}', b"[1, 2]", b"{not json",
    b'{"token_ids": [3], "tags": [1]}', b'{"token_ids": [4], "prompt_tokens": -2}', b'"text"',
    b'{"token_ids": [12, 13], "timestamp": 5, "arrived_at": null, "model": 3, "session_id": "s"}',
    b'{"token_ids": [99999999999, 1]}', b'{"token_ids": [ ]}', b'{"token_ids": [0, 10, 0] }',
]  # fmt: skip


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trace")
    paths, _ = write_traces(
        folder, requests=120, block_sizes=[16], start=datetime(2026, 1, 1, tzinfo=UTC), seconds=60
    )
    good = paths[16].read_bytes().splitlines()
    mixed = folder / "mixed.jsonl"
    mixed.write_bytes(b"\n".join([good[0], *ODD_LINES, *good[1:]]) + b"\n")
    return mixed


def _read(trace: Path, monkeypatch: pytest.MonkeyPatch, way: str) -> Lines:
    with monkeypatch.context() as patched:
        if way == "whole line in Python":  # as before token ids were left undecoded
            patched.setattr(readers, "_decode_prefixlens", lambda decode_any: decode_any)
        elif way == "ids in Python":  # no C extension: the undecoded ids decoded by msgspec
            patched.setattr(lines_module, "_plain_token_ids", None)
        return readers.read_trace(trace, align=64)


def test_token_ids_read_in_c_are_those_read_in_python(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if lines_module._plain_token_ids is None:  # type: ignore[attr-defined]
        pytest.skip("app/domain/_chain.c was not built (no C compiler at install)")
    in_c = _read(trace, monkeypatch, "ids in C")
    assert len(in_c.lines) > 120 and in_c.skipped  # the odd lines were read or skipped, not all skipped
    for way in ("whole line in Python", "ids in Python"):
        other = _read(trace, monkeypatch, way)
        assert other.lines == in_c.lines, way
        assert other.tokens.tolist() == in_c.tokens.tolist(), way
        assert other.skipped == in_c.skipped, way
