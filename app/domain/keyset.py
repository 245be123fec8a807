"""Keyset-pagination cursors: where a page of request records ended, bound to the filters it was read
under, as an opaque URL-safe token.

A page is read newest first by (arrived_at, server id, request id), the request record's key; the
next page starts strictly after (older than) the last row of this one. Unlike an OFFSET, that costs
the same on page 1,000 as on page 1, and a row arriving meanwhile shifts nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime


class BadCursor(ValueError):
    """A cursor that is not one this module wrote, or one written under other filters."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """The last row of a page: the next page holds the rows strictly older in key order."""

    arrived_at: datetime
    server_id: int
    request_id: str


def filters_fingerprint(filters: Mapping[str, str]) -> str:
    """A short digest of a filter set (names to their values as text; empty values left out): a
    cursor carries it so that it is refused under any other filters."""
    canonical = json.dumps({k: v for k, v in sorted(filters.items()) if v}, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def encode_cursor(cursor: Cursor, *, fingerprint: str) -> str:
    """The cursor as an opaque token (base64url of a small JSON document, no padding)."""
    document = {
        "a": cursor.arrived_at.isoformat(),
        "s": cursor.server_id,
        "r": cursor.request_id,
        "f": fingerprint,
    }
    raw = json.dumps(document, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(token: str, *, fingerprint: str) -> Cursor:
    """The cursor in a token from encode_cursor under the same filters.

    Raises BadCursor for anything else: not base64 or JSON, a field missing or of the wrong type, a
    time without a time zone, or a fingerprint of other filters.
    """
    try:
        document = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        arrived_at = datetime.fromisoformat(document["a"])
        server_id, request_id, signed = document["s"], document["r"], document["f"]
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise BadCursor("not a cursor of this list") from exc
    if not (isinstance(server_id, int) and isinstance(request_id, str) and request_id):
        raise BadCursor("not a cursor of this list")
    if arrived_at.tzinfo is None:
        raise BadCursor("not a cursor of this list")
    if signed != fingerprint:
        raise BadCursor("this cursor belongs to other filters: start again from the first page")
    return Cursor(arrived_at, server_id, request_id)
