"""Binary COPY of rows with int4[] and int8[] columns (token ids, block hashes), the arrays built by numpy.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
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


def integer_array(values: Sequence[int] | None, elements: _Elements) -> bytes | None:
    """`values` as PostgreSQL's binary one-dimensional array without NULLs; None stays None (NULL).

    OverflowError when a value does not fit the element type, TypeError when one is not an integer
    (None included: these arrays hold no NULLs).
    """
    if values is None:
        return None
    if not values:
        return _NO_DIMENSION.pack(0, 0, elements.oid)
    items = np.frombuffer(array.array(elements.typecode, values), f"=i{elements.size}")
    encoded = np.empty(len(items), elements.encoded)
    encoded["length"] = elements.size
    encoded["value"] = items
    return _DIMENSION.pack(1, 0, elements.oid, len(items), 1) + encoded.tobytes()


def write_rows(
    copy: Copy, rows: Sequence[Sequence[Any]], *, columns: Sequence[str], types: Sequence[str]
) -> None:
    """Write `rows` to a binary COPY of `columns`, whose PostgreSQL types are `types` ("int8",
    "varchar", "int4[]" ...); the COPY's types are set here.

    NumericValueOutOfRange, before anything is written, when an integer does not fit its column.
    """
    _check_ranges(rows, columns=columns, types=types)
    arrays = [(index, _ARRAYS[kind]) for index, kind in enumerate(types) if kind in _ARRAYS]
    copy.set_types(["bytea" if kind in _ARRAYS else kind for kind in types])
    for row in rows:
        values = list(row)
        for index, elements in arrays:
            try:
                values[index] = integer_array(values[index], elements)
            except OverflowError:
                raise _out_of_range(columns[index], types[index]) from None
        copy.write_row(values)


def _check_ranges(rows: Sequence[Sequence[Any]], *, columns: Sequence[str], types: Sequence[str]) -> None:
    # Column by column over the distinct values: a batch repeats most of them.
    for index, kind in enumerate(types):
        if kind in _BITS:
            limit = 1 << (_BITS[kind] - 1)
            values = {row[index] for row in rows}
            values.discard(None)
            if values and not -limit <= min(values) <= max(values) < limit:
                raise _out_of_range(columns[index], kind)


def _out_of_range(column: str, kind: str) -> NumericValueOutOfRange:
    return NumericValueOutOfRange(f"{column}: a value is out of range for {kind}")
