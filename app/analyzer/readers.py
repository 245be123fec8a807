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

A line that cannot be read is skipped and counted under a `Skip` reason; the file goes on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from app.analyzer import chat, export_format
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

FORMATS = ("prefixlens", "kvlint", "openai-log", "prefixscope")

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
    if "token_ids" in first:
        return "prefixlens"
    return "kvlint"


def read_trace(path: Path, *, format: str | None = None, align: int = 16, jobs: int = 1) -> Lines:
    """Read `path` (format sniffed from its first object line unless given). Token ids are padded
    to multiples of `align` in the buffer. A large file is read in up to `jobs` parts side by side
    (a forked process each but the first) and joined in file order. Raises ValueError for an
    unknown format and OSError for a file that cannot be read."""
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}: one of {', '.join(FORMATS)}")
    with path.open("rb") as file:
        first = _first_object(file, format)
        if first is None:
            return Lines(format or "prefixlens", align)
        found, start, number = first
        ends = _part_ends(file, start, jobs)
    starts = [start, *ends[:-1]]
    if len(ends) == 1:
        return _read_part(path, found, align, start, ends[0], number)
    fork = multiprocessing.get_context("fork")
    later: list[Future[tuple[Lines, str]]] = []
    try:
        with ProcessPoolExecutor(len(ends) - 1, mp_context=fork) as pool:
            later = [pool.submit(_read_later_part, path, found, align, begin, end)
                     for begin, end in zip(starts[1:], ends[1:], strict=True)]  # fmt: skip
            lines = _read_part(path, found, align, start, ends[0], number)
            for part in later:
                read, spilled = part.result()
                with open(spilled, "rb") as tokens:
                    lines.extend(read, tokens)
    finally:
        _remove_spilled(later)  # the pool has ended: every part is done
    return lines


def _remove_spilled(parts: list[Future[tuple[Lines, str]]]) -> None:
    """Delete the token ids the parts wrote, prompt content, whether or not the reading ended well."""
    for part in parts:
        if not part.cancelled() and part.exception() is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part.result()[1])


def _first_object(file: BinaryIO, format: str | None) -> tuple[str, int, int] | None:
    """The format, and the offset and number of the line reading starts at: the first, when the
    format is given, else the first object line (it names the format); None: no such line."""
    if format is not None:
        return format, 0, 1
    decode = msgspec.json.Decoder().decode
    offset = 0
    for number, raw in enumerate(file, start=1):
        try:
            item = decode(raw) if raw and not raw.isspace() else None
        except msgspec.DecodeError:
            item = None
        if isinstance(item, dict):
            return sniff(item), offset, number
        offset += len(raw)
    return None


def _part_ends(file: BinaryIO, start: int, jobs: int) -> list[int]:
    """Where each part of the file from `start` ends: about equal, each at a line's end; one part
    for a file too small to gain from more."""
    size = file.seek(0, os.SEEK_END)
    parts = max(1, min(jobs, (size - start) // PART_BYTES_LEAST))
    ends = []
    for part in range(1, parts):
        file.seek(start + (size - start) * part // parts)
        file.readline()  # to the end of the line the cut fell in
        ends.append(file.tell())
    return [*sorted(set(ends) - {size}), size]


def _read_part(path: Path, format: str, align: int, start: int, end: int, number: int | None) -> Lines:
    """The lines of `path` from byte `start` to `end` (`number`: the first's line number; None:
    counted here)."""
    decode_any: Decode = msgspec.json.Decoder().decode
    decode = _decode_prefixlens(decode_any) if format == "prefixlens" else decode_any
    lines = Lines(format, align)
    with path.open("rb") as file:
        if number is None:
            number = _lines_before(file, start) + 1
        file.seek(start)
        at = start
        for line_number, raw in enumerate(file, start=number):
            if at >= end:
                break
            at += len(raw)
            if not raw or raw.isspace():  # no copy of a long line, as strip() made
                continue
            try:
                item = decode(raw)
            except msgspec.DecodeError:
                item = None
            _add(lines, item, line_number, raw)
    return lines


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
