"""A trace read through its compression: gzip, bzip2, xz or zstd, told by its first bytes.

Request logs are kept compressed, and a user should not have to unpack gigabytes to try the
analyzer. The standard library's readers raise EOFError when the data ends inside a stream;
zstandard's own reader ends there quietly, so zstd is read frame by frame here and says so too
(a trace cut short would otherwise be analyzed as if whole).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

MAGIC_BYTES = 6  # the longest of the signatures below (xz's)
_SIGNATURES = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}
_CHUNK = 1 << 20  # compressed bytes read at a time

# What the readers raise where the data is damaged or cut short.
DAMAGED = (EOFError, OSError, zlib.error, lzma.LZMAError, zstandard.ZstdError)


@dataclass(frozen=True, slots=True)
class Opened:
    """A stream of lines, and what it was compressed with ("" for nothing)."""

    stream: BinaryIO
    kind: str


def kind(head: bytes) -> str | None:
    """The compression whose signature `head` (a stream's first bytes) starts with; None: none."""
    return next((name for magic, name in _SIGNATURES.items() if head.startswith(magic)), None)


def opened(source: BinaryIO) -> Opened:
    """`source` decompressed as it is read when its first bytes say it is compressed, else as it
    is. Its first bytes are read and given back in front of it: standard input cannot seek."""
    head = _read_at_least(source, MAGIC_BYTES)
    raw = io.BufferedReader(_Prefixed(head, source), _CHUNK)
    match kind(head):
        case "gzip":
            return Opened(gzip.GzipFile(fileobj=raw, mode="rb"), "gzip")  # type: ignore[arg-type]
        case "bzip2":
            return Opened(bz2.BZ2File(raw), "bzip2")  # type: ignore[arg-type]
        case "xz":
            return Opened(lzma.LZMAFile(raw), "xz")  # type: ignore[arg-type]
        case "zstd":
            return Opened(io.BufferedReader(_ZstdFrames(raw), _CHUNK), "zstd")
    return Opened(raw, "")


def _read_at_least(source: BinaryIO, size: int) -> bytes:
    """The first `size` bytes (fewer only at the end): a pipe may hand over less at a time."""
    head = b""
    while len(head) < size and (more := source.read(size - len(head))):
        head += more
    return head


class _Prefixed(io.RawIOBase):
    """`head`, then the rest of `source`."""

    def __init__(self, head: bytes, source: BinaryIO) -> None:
        self._head = memoryview(head)
        self._source = source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._head:
            count = min(len(buffer), len(self._head))
            buffer[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._source.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _ZstdFrames(io.RawIOBase):
    """A zstd stream's frames one after the other, decompressed; EOFError when it ends inside one."""

    def __init__(self, source: BinaryIO) -> None:
        self._source = source
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._in_frame = False  # a frame was begun and has not ended
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._out:
            chunk = self._source.read(_CHUNK)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd data ended inside a frame")
                return 0
            self._out = memoryview(self._decompressed(chunk))
        count = min(len(buffer), len(self._out))
        buffer[:count] = self._out[:count]
        self._out = self._out[count:]
        return count

    def _decompressed(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            if self._frame.eof:
                self._frame = self._decompressor.decompressobj()
            out.append(self._frame.decompress(chunk))
            self._in_frame = not self._frame.eof
            chunk = self._frame.unused_data if self._frame.eof else b""
        return b"".join(out)
