"""What the readers make of a trace file: one `Line` per request, the token ids of all of them in
one buffer, and the lines skipped by reason. Shared by the readers (readers.py, chat.py) and the
analysis."""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import IO, Any

import msgspec
import numpy as np
import numpy.typing as npt

try:  # built from app/domain/_chain.c at install when a compiler was at hand
    from app.domain._chain import json_token_ids as _plain_token_ids
except ImportError:
    _plain_token_ids = None  # type: ignore[assignment]


class Skip(StrEnum):
    """Why a line of a trace was skipped (counted, never fatal)."""

    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    NO_PROMPT = "no_prompt"  # neither token ids, text, nor block hashes with a prompt length
    BAD_FIELD = "bad_field"  # a field of the wrong type or out of range
    BAD_MESSAGES = "bad_messages"  # chat messages that cannot be rendered
    EMPTY_PROMPT = "empty_prompt"


@dataclass(slots=True)
class Line:
    """One request as read. `arrived`: seconds (None: not in the file, taken in file order);
    `tokens`: its span in `Lines.tokens` (None without token ids); `block_hashes`: the engine's
    chain at `block_size` (signed 64-bit), when the file has it."""

    request_id: str
    arrived: float | None
    prompt_tokens: int
    server: str = ""
    group: str = ""
    salt: str = ""
    tenant: str = ""
    template: str = ""
    session: str = ""
    output_tokens: int = 0
    held_seconds: float = 0.0
    cached_tokens: int | None = None
    block_size: int = 0
    block_hashes: tuple[int, ...] = ()
    unsalted_hashes: tuple[int, ...] = ()
    tokens: tuple[int, int] | None = None


@dataclass(slots=True)
class Lines:
    """A trace as read: its lines, their token ids (each request's padded with zeros to a multiple
    of `align` tokens, so that a block of any divisor of it starts on a row), and what was skipped."""

    format: str
    align: int
    lines: list[Line] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    tokenized: int = 0  # lines whose text the bundled tokenizer tokenized
    _buffer: array[int] = field(default_factory=lambda: array("i"))

    def add_tokens(self, token_ids: list[int] | bytes) -> tuple[int, int]:
        """Append a prompt's token ids (or their native int32 bytes, as `raw_token_ids` gives
        them: ids of digits alone, none negative); their span. Raises TypeError for a non-integer,
        OverflowError for an id outside int32 and ValueError for a negative one (nothing is then
        appended)."""
        buffer = self._buffer
        start = len(buffer)
        if isinstance(token_ids, bytes):
            buffer.frombytes(token_ids)
        else:
            try:
                buffer.extend(token_ids)  # checks each id's type and range in C
            except (TypeError, OverflowError):
                del buffer[start:]
                raise
            if token_ids and min(token_ids) < 0:
                del buffer[start:]
                raise ValueError("negative token id")
        end = len(buffer)
        if pad := -end % self.align:
            buffer.extend([0] * pad)
        return start, end

    @property
    def tokens(self) -> npt.NDArray[np.int32]:
        """Every line's token ids, one buffer (a view: no copy)."""
        return np.frombuffer(self._buffer, dtype=np.int32)

    def token_ids(self, line: Line) -> npt.NDArray[np.int32] | None:
        """The line's token ids (a view), None without them."""
        if line.tokens is None:
            return None
        start, end = line.tokens
        return self.tokens[start:end]

    def skip(self, reason: Skip) -> None:
        self.skipped[reason.value] += 1

    def move_tokens(self, file: IO[bytes]) -> None:
        """Write the token ids to `file` (to be given to `extend` with these lines), none kept."""
        self._buffer.tofile(file)
        self._buffer = array("i")

    def extend(self, later: Lines, tokens: IO[bytes]) -> None:
        """Append what was read of a later part of the file: its lines, their token ids (moved to
        `tokens`) to follow these (both padded to `align`), and its counts."""
        shift = len(self._buffer)
        for line in later.lines:
            if line.tokens is not None:
                line = replace(line, tokens=(line.tokens[0] + shift, line.tokens[1] + shift))
            self.lines.append(line)
        self._buffer.frombytes(tokens.read())
        self.skipped.update(later.skipped)
        self.notes.extend(later.notes)
        self.tokenized += later.tokenized


class BadLine(ValueError):
    """A line that cannot be read, with the reason it is counted under."""

    def __init__(self, reason: Skip) -> None:
        super().__init__(reason.value)
        self.reason = reason


def raw_token_ids(raw: msgspec.Raw) -> object:
    """A line's `token_ids` left undecoded (msgspec.Raw): native int32 bytes when a plain array of
    ids (app/domain/_chain.c reads them without a Python int each), else the decoded JSON value."""
    if _plain_token_ids is not None and (plain := _plain_token_ids(raw)) is not None:
        return plain
    return msgspec.json.decode(raw)


def add_token_ids(lines: Lines, token_ids: object) -> tuple[int, int]:
    """Add a line's token ids to the buffer; BadLine unless a non-empty list of int32 ids (or their
    int32 bytes, from `raw_token_ids`)."""
    if isinstance(token_ids, bytes) and token_ids:
        return lines.add_tokens(token_ids)
    if not isinstance(token_ids, list):
        raise BadLine(Skip.BAD_FIELD)
    if not token_ids:
        raise BadLine(Skip.EMPTY_PROMPT)
    try:
        return lines.add_tokens(token_ids)
    except (TypeError, OverflowError, ValueError):
        raise BadLine(Skip.BAD_FIELD) from None


def text(value: object, default: str = "") -> str:
    """A string field (numbers are named by their digits); `default` when absent."""
    if value is None:
        return default
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    raise BadLine(Skip.BAD_FIELD)


def natural(value: object, default: int | None) -> int | None:
    """A count: an int >= 0; `default` when absent."""
    if value is None:
        return default
    if type(value) is not int or value < 0:
        raise BadLine(Skip.BAD_FIELD)
    return value


def arrival(item: dict[str, Any]) -> float | None:
    """`arrived_at` (ISO 8601; a naive time is UTC) or `timestamp` (seconds), None when neither."""
    at = item.get("arrived_at")
    if isinstance(at, str):
        try:
            parsed = datetime.fromisoformat(at)
        except ValueError:
            raise BadLine(Skip.BAD_FIELD) from None
        return parsed.timestamp() if parsed.tzinfo else parsed.replace(tzinfo=UTC).timestamp()
    stamp = item.get("timestamp", at)
    if stamp is None:
        return None
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        return float(stamp)
    raise BadLine(Skip.BAD_FIELD)
