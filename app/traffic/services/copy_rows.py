"""Binary COPY of rows with int4[] and int8[] columns (token ids, block hashes), the arrays built by numpy;
and such arrays read back from `array_send`.

psycopg's binary COPY (`set_types`, `write_row`) dumps a list element by element in Python: for
request records with 1,800 token ids and 113 block hashes that was most of the ingest's time, 3,203
rows/s where PostgreSQL takes a pre-built stream of them at 8,477 (issue 10, D). Here each such
array is encoded whole, in PostgreSQL's binary array format (what `array_send` writes and
`array_recv` reads): the number of dimensions (1), a has-NULLs flag (0), the element type's oid, the
length and lower bound (1) of the dimension, then each element as its 4-byte length and its
big-endian value; an empty array is the first three alone. The finished arrays go to psycopg's
`write_row` as bytes, which its bytea dumper passes on as they are (a binary COPY's fields carry
no type: the server reads each with its column's receive function); psycopg dumps the other
columns and frames the rows in C, as before. The stream is the one psycopg writes itself, byte
for byte (tests/traffic/test_copy_rows.py).

psycopg's binary dumpers wrap an int2 or int4 that does not fit round (2**31 is written as
-2**31), and refuse an int8 that does not with OverflowError. So integers are checked against their
column's type first, and one that does not fit raises NumericValueOutOfRange (a DataError), as
PostgreSQL does; the message names the column, never the value (token ids are prompt text).
"""

import array
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from psycopg import Copy
from psycopg.errors import NumericValueOutOfRange

_DIMENSION = struct.Struct("!iiiii")  # dimensions, has NULLs, element oid, length, lower bound
_NO_DIMENSION = struct.Struct("!iii")  # an empty array: no dimensions, no NULLs, element oid
_BITS = {"int2": 16, "int4": 32, "int8": 64}  # of PostgreSQL's integers


@dataclass(frozen=True, slots=True)
class _Elements:
    """What an integer array's elements are in PostgreSQL and in Python's array module."""

    oid: int
    typecode: str  # array.array's, of the element's size: it refuses what does not fit
    size: int

    @property
    def encoded(self) -> np.dtype[Any]:
        return np.dtype([("length", ">i4"), ("value", f">i{self.size}")])


_ARRAYS = {
    "int4[]": _Elements(oid=23, typecode="i", size=4),
    "int8[]": _Elements(oid=20, typecode="q", size=8),
}
assert all(array.array(e.typecode).itemsize == e.size for e in _ARRAYS.values())
_EMPTY = {e.oid: _NO_DIMENSION.pack(0, 0, e.oid) for e in _ARRAYS.values()}  # a small record's arrays
_ENCODED_BY_OID = {e.oid: e.encoded for e in _ARRAYS.values()}  # built once: a dtype costs a microsecond


def integer_array(
    values: Sequence[int] | npt.NDArray[np.integer] | None, elements: _Elements
) -> bytes | None:
    """`values` as PostgreSQL's binary one-dimensional array without NULLs; None stays None (NULL).

    `values` may be a numpy integer array (token ids converted once, app.domain.blockhash.int64_ids).
    OverflowError when a value does not fit the element type, TypeError when one is not an integer
    (None included: these arrays hold no NULLs).
    """
    if values is None:
        return None
    if not len(values):
        return _EMPTY[elements.oid]
    if isinstance(values, np.ndarray):
        limit = 1 << (8 * elements.size - 1)
        if values.dtype.kind not in "iu" or not -limit <= int(values.min()) <= int(values.max()) < limit:
            raise OverflowError(f"a value does not fit int{8 * elements.size}")
        items = values
    else:
        items = np.frombuffer(array.array(elements.typecode, values), f"=i{elements.size}")
    encoded = np.empty(len(items), elements.encoded)
    encoded["length"] = elements.size
    encoded["value"] = items
    return _DIMENSION.pack(1, 0, elements.oid, len(items), 1) + encoded.tobytes()


def sent_integers(sent: bytes | memoryview | None) -> npt.NDArray[np.int64] | None:
    """An int4[] or int8[] as `array_send` gives it (the format above), as a native int64 array;
    None stays None. psycopg's text parsing of a 2,000-element array cost more than the diagnosis
    of its row."""
    if sent is None:
        return None
    dimensions, _, oid = _NO_DIMENSION.unpack_from(sent)
    if not dimensions:
        return np.empty(0, np.int64)
    if dimensions != 1:
        raise ValueError("only one-dimensional arrays are read")
    values = np.frombuffer(sent, _ENCODED_BY_OID[oid], offset=_DIMENSION.size)["value"]
    return values.astype(np.int64)


def write_rows(
    copy: Copy, rows: Iterable[Sequence[Any]], *, columns: Sequence[str], types: Sequence[str]
) -> None:
    """Write `rows` to a binary COPY of `columns`, whose PostgreSQL types are `types` ("int8",
    "varchar", "int4[]" ...); the COPY's types are set here.

    `rows` may be a generator: each row is encoded as it comes. NumericValueOutOfRange, before
    the row is written, when an integer does not fit its column; the caller's COPY then fails whole.
    """
    encode = _RowEncoder(columns, types)
    copy.set_types(encode.copy_types)
    for row in rows:
        copy.write_row(encode(row))


class _RowEncoder:
    """A row's values as write_row takes them: integers checked against their columns, integer
    arrays encoded whole (the COPY's type for them is bytea)."""

    def __init__(self, columns: Sequence[str], types: Sequence[str]) -> None:
        self.columns, self.types = columns, types
        self.scalars = [(index, 1 << (_BITS[kind] - 1)) for index, kind in enumerate(types) if kind in _BITS]
        self.arrays = [(index, _ARRAYS[kind]) for index, kind in enumerate(types) if kind in _ARRAYS]
        self.copy_types = ["bytea" if kind in _ARRAYS else kind for kind in types]

    def __call__(self, row: Sequence[Any]) -> list[Any]:
        values = list(row)
        for index, limit in self.scalars:
            value = values[index]
            if value is not None and not -limit <= value < limit:
                raise _out_of_range(self.columns[index], self.types[index])
        for index, elements in self.arrays:
            try:
                values[index] = integer_array(values[index], elements)
            except OverflowError:
                raise _out_of_range(self.columns[index], self.types[index]) from None
        return values


def _out_of_range(column: str, kind: str) -> NumericValueOutOfRange:
    return NumericValueOutOfRange(f"{column}: a value is out of range for {kind}")
