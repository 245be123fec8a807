from datetime import UTC, datetime

import pytest

from app.domain.keyset import BadCursor, Cursor, decode_cursor, encode_cursor, filters_fingerprint

AT = datetime(2026, 12, 2, 5, 0, 1, 250_000, tzinfo=UTC)


def test_a_cursor_comes_back_as_it_was_written_under_the_same_filters() -> None:
    cursor = Cursor(AT, 7, "req/with~odd chars é")
    fingerprint = filters_fingerprint({"server": "vllm-0", "window": "1h"})
    token = encode_cursor(cursor, fingerprint=fingerprint)
    assert "=" not in token and "/" not in token and "+" not in token  # safe in a URL as it is
    assert decode_cursor(token, fingerprint=fingerprint) == cursor


def test_the_fingerprint_ignores_empty_filters_and_their_order_but_not_their_values() -> None:
    assert filters_fingerprint({"a": "1", "b": ""}) == filters_fingerprint({"a": "1"})
    assert filters_fingerprint({"a": "1", "c": "2"}) == filters_fingerprint({"c": "2", "a": "1"})
    assert filters_fingerprint({"a": "1"}) != filters_fingerprint({"a": "2"})


def test_a_cursor_of_other_filters_is_refused() -> None:
    token = encode_cursor(Cursor(AT, 1, "r"), fingerprint=filters_fingerprint({"tenant": "acme"}))
    with pytest.raises(BadCursor, match="other filters"):
        decode_cursor(token, fingerprint=filters_fingerprint({"tenant": "globex"}))


@pytest.mark.parametrize("token", ["", "%%%", "bm90IGpzb24", "WzEsIDJd", "eyJhIjogMX0", "IjEi"])
def test_anything_else_is_a_bad_cursor(token: str) -> None:
    with pytest.raises(BadCursor):
        decode_cursor(token, fingerprint="0")
