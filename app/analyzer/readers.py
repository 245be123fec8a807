"""JSON-lines traces into `Lines`: the formats the offline analyzer reads, sniffed from the first line.

- `prefixlens` (prefixlens 0.1.0's corpus): `token_ids`, optional `request_id`, `tenant`, `route`,
  `model`, `tags` (a `template` tag names the template). Lines that also say `arrived_at` (ISO
  8601) or `timestamp` (seconds), `server`, `prompt_tokens` and `cached_tokens` (what the engine
  reused, as bench/analysis_trace.py writes them) give them to the analysis.
- `kvlint` (kvlint 0.1.1's `openai`, `sharegpt` and `plain` inputs): a request body's `messages`
  (and `tools`), a ShareGPT `conversations` list (one request per user turn, each carrying the
  history), or a plain `prompt` text; see chat.py for how text becomes tokens.
- `openai-log`: a request log, `{"request": body, "response": body}` per line (see chat.py).
- `prefixscope`: Prefixscope's own export (export_format.py).
- `mooncake`: Mooncake's traces (`hash_ids` of 512-token blocks, no token ids: mooncake.py), as
  Dynamo's replay, AIPerf and kvcache-simulator read them.

A line that cannot be read is skipped and counted under a `Skip` reason; the file goes on.

A file is cut into parts read side by side. Standard input (`-`) and a compressed file (gzip, bzip2,
xz or zstd, told by its first bytes whatever its name: compressed.py) cannot be cut: they are read
in one pass, decompressed as they come. Compressed data damaged or cut short ends the reading there:
the lines before it are kept, and a note says where and why.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from app.analyzer import chat, compressed, export_format, mooncake
from app.analyzer.lines import (
    BadLine,
    Line,
    Lines,
    Skip,
    add_token_ids,
    arrival,
    natural,
    raw_token_ids,
    text,
)

FORMATS = ("prefixlens", "kvlint", "openai-log", "prefixscope", "mooncake")
STDIN = Path("-")  # the trace path that reads standard input

PART_BYTES_LEAST = 16 << 20  # a file is read in parts of at least this: a process costs a fork

Decode = Callable[[bytes], Any]
_Field = Any  # a field of a prefixlens line, decoded as a dict's value would be


class _PrefixlensLine(msgspec.Struct):
    """The fields `_prefixlens` reads (UNSET: absent), `token_ids` left undecoded: most of a line's
    bytes, read by `raw_token_ids` without a Python int per id."""

    token_ids: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    request_id: _Field = msgspec.UNSET
    arrived_at: _Field = msgspec.UNSET
    timestamp: _Field = msgspec.UNSET
    prompt_tokens: _Field = msgspec.UNSET
    server: _Field = msgspec.UNSET
    model: _Field = msgspec.UNSET
    tenant: _Field = msgspec.UNSET
    tags: _Field = msgspec.UNSET
    template: _Field = msgspec.UNSET
    route: _Field = msgspec.UNSET
    session_id: _Field = msgspec.UNSET
    cached_tokens: _Field = msgspec.UNSET
    output_tokens: _Field = msgspec.UNSET
    completion_tokens: _Field = msgspec.UNSET


def sniff(first: dict[str, Any]) -> str:
    """The format of a trace whose first line decodes to `first`."""
    if isinstance(first.get("request"), dict) and isinstance(first.get("response"), dict):
        return "openai-log"
    if "arrived" in first and "prompt_tokens" in first:
        return "prefixscope"
    if "hash_ids" in first and "input_length" in first:
        return "mooncake"
    if "token_ids" in first:
        return "prefixlens"
    return "kvlint"


def read_trace(path: Path, *, format: str | None = None, align: int = 16, jobs: int = 1) -> Lines:
    """Read `path` (STDIN: standard input; format sniffed from its first object line unless
    given). Token ids are padded to multiples of `align` in the buffer. A large file is read in up
    to `jobs` parts side by side (a forked process each but the first) and joined in file order;
    standard input and a compressed file in one pass (module docstring). Raises ValueError for an
    unknown format and OSError for a file that cannot be read, or whose compressed data is damaged
    before its first line."""
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}: one of {', '.join(FORMATS)}")
    if path == STDIN:
        return _read_stream(sys.stdin.buffer, format, align)
    with path.open("rb") as file:
        if compressed.kind(file.peek(compressed.MAGIC_BYTES)) is not None:
            return _read_stream(file, format, align)
        found = format or _sniffed(file)
        ends = _part_ends(file, jobs)
    if found is None:  # no object line: each line is counted as what it is
        found = "prefixlens"
    starts = [0, *ends[:-1]]
    if len(ends) == 1:
        return _read_part(path, found, align, 0, ends[0], 1)
    fork = multiprocessing.get_context("fork")
    later: list[Future[tuple[Lines, str]]] = []
    try:
        with ProcessPoolExecutor(len(ends) - 1, mp_context=fork) as pool:
            later = [pool.submit(_read_later_part, path, found, align, begin, end)
                     for begin, end in zip(starts[1:], ends[1:], strict=True)]  # fmt: skip
            lines = _read_part(path, found, align, 0, ends[0], 1)
            for part in later:
                read, spilled = part.result()
                with open(spilled, "rb") as tokens:
                    lines.extend(read, tokens)
    finally:
        _remove_spilled(later)  # the pool has ended: every part is done
    return lines


def _read_stream(stream: BinaryIO, format: str | None, align: int) -> Lines:
    """A trace that cannot be cut into parts, in one pass: the lines up to its first object line
    are held until it names the format."""
    opened = compressed.opened(stream)
    ended: list[str] = []
    raws = _until_damaged(opened, ended)
    held: list[bytes] = []
    if format is None:
        for raw in raws:
            held.append(raw)
            if (format := _format_of(raw)) is not None:
                break
    lines = Lines(format or "prefixlens", align)
    _add_all(lines, itertools.chain(held, raws), 1)
    if ended:
        if not lines.lines and not lines.skipped:
            raise OSError(f"{opened.kind or 'input'} data damaged before its first line: {ended[0]}")
        read = sum(lines.skipped.values()) + len(lines.lines)
        lines.notes.append(
            f"The {opened.kind or 'input'} data was damaged or cut short after {read} line(s) ({ended[0]}):"
            " the lines before it are analyzed, nothing after it."
        )
    return lines


def _until_damaged(opened: compressed.Opened, ended: list[str]) -> Iterator[bytes]:
    """The stream's lines, up to its end or to where its compressed data is damaged or cut short
    (what was wrong appended to `ended`)."""
    try:
        yield from opened.stream
    except compressed.DAMAGED as error:
        ended.append(str(error) or type(error).__name__)


def _remove_spilled(parts: list[Future[tuple[Lines, str]]]) -> None:
    """Delete the token ids the parts wrote, prompt content, whether or not the reading ended well."""
    for part in parts:
        if not part.cancelled() and part.exception() is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part.result()[1])


def _sniffed(file: BinaryIO) -> str | None:
    """The format its first object line names (None: no such line); the file is left at its start."""
    try:
        for raw in file:
            if (found := _format_of(raw)) is not None:
                return found
        return None
    finally:
        file.seek(0)


def _format_of(raw: bytes) -> str | None:
    """The format a line names when it is a JSON object, else None."""
    try:
        item = msgspec.json.decode(raw) if raw and not raw.isspace() else None
    except msgspec.DecodeError:
        return None
    return sniff(item) if isinstance(item, dict) else None


def _part_ends(file: BinaryIO, jobs: int) -> list[int]:
    """Where each part of the file ends: about equal, each at a line's end; one part for a file
    too small to gain from more."""
    size = file.seek(0, os.SEEK_END)
    parts = max(1, min(jobs, size // PART_BYTES_LEAST))
    ends = []
    for part in range(1, parts):
        file.seek(size * part // parts)
        file.readline()  # to the end of the line the cut fell in
        ends.append(file.tell())
    return [*sorted(set(ends) - {size}), size]


def _read_part(path: Path, format: str, align: int, start: int, end: int, number: int | None) -> Lines:
    """The lines of `path` from byte `start` to `end` (`number`: the first's line number; None:
    counted here)."""
    lines = Lines(format, align)
    with path.open("rb") as file:
        if number is None:
            number = _lines_before(file, start) + 1
        file.seek(start)
        _add_all(lines, _up_to(file, end - start), number)
    return lines


def _up_to(file: BinaryIO, size: int) -> Iterator[bytes]:
    """The file's lines from where it is, until `size` bytes were read."""
    left = size
    for raw in file:
        if left <= 0:
            return
        left -= len(raw)
        yield raw


def _add_all(lines: Lines, raws: Iterable[bytes], number: int) -> None:
    """Add each line of `raws` to `lines` (the first is line `number`), or count it skipped."""
    decode_any: Decode = msgspec.json.Decoder().decode
    decode = _decode_prefixlens(decode_any) if lines.format == "prefixlens" else decode_any
    for line_number, raw in enumerate(raws, start=number):
        if not raw or raw.isspace():  # no copy of a long line, as strip() made
            continue
        try:
            item = decode(raw)
        except msgspec.DecodeError:
            item = None
        _add(lines, item, line_number, raw)


def _read_later_part(path: Path, format: str, align: int, start: int, end: int) -> tuple[Lines, str]:
    """`_read_part` in a worker: its lines, and the temporary file its token ids were moved to
    (written and read back at memory speed, where a pickled buffer crossed the pipe slower)."""
    lines = _read_part(path, format, align, start, end, None)
    with tempfile.NamedTemporaryFile(prefix="prefixscope-tokens-", delete=False) as spill:
        lines.move_tokens(spill)
    return lines, spill.name


def _lines_before(file: BinaryIO, offset: int) -> int:
    file.seek(0)
    count, left = 0, offset
    while left > 0:
        chunk = file.read(min(left, 1 << 24))
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count


def _decode_prefixlens(decode_any: Decode) -> Decode:
    """A decoder of prefixlens lines: an object line into the dict of the fields `_prefixlens`
    reads, as `decode_any` would give them; any other line as `decode_any` decodes it."""
    decode_line = msgspec.json.Decoder(_PrefixlensLine).decode
    fields = _PrefixlensLine.__struct_fields__

    def decode(raw: bytes) -> Any:
        try:
            line = decode_line(raw)
        except msgspec.ValidationError:  # valid JSON, not an object: counted by _add
            return decode_any(raw)
        item = {name: value for name in fields if (value := getattr(line, name)) is not msgspec.UNSET}
        if "token_ids" in item:
            item["token_ids"] = raw_token_ids(item["token_ids"])
        return item

    return decode


def _add(lines: Lines, item: object, number: int, raw: bytes) -> None:
    if item is None:
        lines.skip(Skip.INVALID_JSON)
        return
    if not isinstance(item, dict):
        lines.skip(Skip.NOT_AN_OBJECT)
        return
    try:
        for line in _read(lines, item, number):
            lines.lines.append(line)
    except BadLine as bad:
        lines.skip(bad.reason)


def _read(lines: Lines, item: dict[str, Any], number: int) -> Iterator[Line]:
    match lines.format:
        case "prefixlens":
            yield _prefixlens(lines, item, number)
        case "prefixscope":
            yield export_format.read_line(lines, item, number)
        case "openai-log":
            yield chat.read_log_line(lines, item, number)
        case "mooncake":
            yield mooncake.read_line(item, number)
        case _:
            yield from chat.read_kvlint_line(lines, item, number)


def _prefixlens(lines: Lines, item: dict[str, Any], number: int) -> Line:
    token_ids = item.get("token_ids")
    if token_ids is None:
        raise BadLine(Skip.NO_PROMPT)
    span = add_token_ids(lines, token_ids)
    tags = item.get("tags") or {}
    if not isinstance(tags, dict):
        raise BadLine(Skip.BAD_FIELD)
    return Line(
        request_id=text(item.get("request_id"), f"line-{number}"),
        arrived=arrival(item),
        prompt_tokens=natural(item.get("prompt_tokens"), None) or span[1] - span[0],
        server=text(item.get("server")),
        group=text(item.get("model")),
        tenant=text(item.get("tenant")),
        template=text(tags.get("template", item.get("template", item.get("route")))),
        session=text(item.get("session_id")),
        cached_tokens=natural(item.get("cached_tokens"), None),
        output_tokens=natural(item.get("output_tokens", item.get("completion_tokens")), 0) or 0,
        tokens=span,
    )
