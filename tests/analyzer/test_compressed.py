"""Traces read compressed (gzip, bzip2, xz, zstd) and from standard input: the same lines as the plain
file; data cut short keeps the lines before the cut and says so."""

import bz2
import gzip
import io
import json
import lzma
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import zstandard

from app.analyzer import compressed, readers
from app.analyzer.cli import main
from app.analyzer.lines import Lines
from bench.analysis_trace import write_traces


def _zstd(data: bytes) -> bytes:
    """Two frames, as `zstd` writes a file appended to: both are read."""
    half = data.index(b"\n", len(data) // 2) + 1
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    return compressor.compress(data[:half]) + compressor.compress(data[half:])


def _gzip(data: bytes) -> bytes:
    """Two members, as `cat a.gz b.gz` makes: both are read."""
    half = data.index(b"\n", len(data) // 2) + 1
    return gzip.compress(data[:half]) + gzip.compress(data[half:])


COMPRESSIONS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": _gzip,
    "bzip2": lambda data: bz2.compress(data, compresslevel=1),  # 100 KB blocks: a cut keeps some
    "xz": lzma.compress,
    "zstd": _zstd,
}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace with a line that is not JSON before its first object line, and one further on."""
    folder = tmp_path_factory.mktemp("trace")
    paths, _ = write_traces(
        folder, requests=80, block_sizes=[16], start=datetime(2026, 1, 1, tzinfo=UTC), seconds=60
    )
    good = paths[16].read_bytes().splitlines()
    mixed = folder / "mixed.jsonl"
    mixed.write_bytes(b"\n".join([b"# exported 2026-01-01", *good[:40], b"{not json", *good[40:]]) + b"\n")
    return mixed


def _same(read: Lines, expected: Lines) -> None:
    assert read.format == expected.format
    assert read.lines == expected.lines
    assert read.tokens.tolist() == expected.tokens.tolist()
    assert read.skipped == expected.skipped


def test_the_junk_before_the_first_object_line_is_counted(plain: Path) -> None:
    lines = readers.read_trace(plain, align=64)
    assert len(lines.lines) == 80 and lines.format == "prefixlens"
    assert lines.skipped == {"invalid_json": 2}  # the header line too, not dropped unseen
    assert lines.lines[0].request_id == "r000000"


@pytest.mark.parametrize("kind", COMPRESSIONS)
def test_a_compressed_trace_reads_as_the_plain_one(plain: Path, tmp_path: Path, kind: str) -> None:
    packed = tmp_path / "trace.jsonl.bin"  # told by its first bytes, not its name
    packed.write_bytes(COMPRESSIONS[kind](plain.read_bytes()))
    assert compressed.kind(packed.read_bytes()[: compressed.MAGIC_BYTES]) == kind
    _same(readers.read_trace(packed, align=64, jobs=2), readers.read_trace(plain, align=64, jobs=1))


@pytest.mark.parametrize("kind", COMPRESSIONS)
def test_data_cut_short_keeps_the_lines_before_the_cut_and_says_so(
    plain: Path, tmp_path: Path, kind: str
) -> None:
    whole = COMPRESSIONS[kind](plain.read_bytes())
    cut = tmp_path / "cut"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    read = readers.read_trace(cut, align=64)
    expected = readers.read_trace(plain, align=64)
    assert 0 < len(read.lines) < len(expected.lines)
    assert read.lines == expected.lines[: len(read.lines)]  # a prefix, and no half of a line
    (note,) = read.notes
    assert note.startswith(f"The {kind} data was damaged or cut short after ") and "nothing after it" in note

    cut.write_bytes(whole[:12])  # not one line
    with pytest.raises(OSError, match=f"{kind} data damaged before its first line"):
        readers.read_trace(cut, align=64)
    assert main(["analyze", str(cut)]) == 2


def test_a_pipe_handing_over_a_byte_at_a_time_is_still_told_compressed(plain: Path) -> None:
    class Trickle(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self.data = data

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
            count = min(1, len(buffer), len(self.data))
            buffer[:count] = self.data[:count]
            self.data = self.data[count:]
            return count

    opened = compressed.opened(Trickle(gzip.compress(plain.read_bytes())))  # type: ignore[arg-type]
    assert opened.kind == "gzip"
    assert opened.stream.read() == plain.read_bytes()


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_standard_input_gives_the_report_of_the_file(plain: Path, kind: str) -> None:
    data = plain.read_bytes() if kind == "plain" else _gzip(plain.read_bytes())
    command = [sys.executable, "-m", "app.analyzer", "analyze", "--json", "--no-curve"]
    piped = subprocess.run([*command, "-"], input=data, capture_output=True, check=True)
    from_file = subprocess.run([*command, str(plain)], capture_output=True, check=True)
    report, expected = json.loads(piped.stdout), json.loads(from_file.stdout)
    assert report.pop("source") == "standard input" and expected.pop("source") == plain.name
    assert report == expected and report["requests"] == 80
