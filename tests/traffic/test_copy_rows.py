"""Binary COPY with numpy-built integer arrays: psycopg's own bytes, PostgreSQL's own rows, and an
integer that does not fit its column refused, never wrapped."""

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import DataError, connection, transaction
from psycopg import Cursor
from psycopg.abc import Buffer
from psycopg.copy import LibpqWriter
from psycopg.errors import NumericValueOutOfRange

from app.domain.blockhash import block_hash_chain, wire_to_signed
from app.traffic.models import RequestRecord
from app.traffic.services.copy_rows import write_rows
from app.traffic.services.record_rows import _TYPES, TABLE_TYPES, RecordRow
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db

COLUMNS = RecordRow._fields
TYPES = {"record table": TABLE_TYPES, "staging table": _TYPES}
ARRIVED = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)
INT4, INT8 = 2**31, 2**63


def row(**fields: Any) -> RecordRow:
    """A record of a 2K-token prompt with its real chain, as the ingest writes one; `fields` replaced."""
    tokens = [random.Random(len(fields)).randrange(151_936) for _ in range(2048)]
    values: dict[str, Any] = {
        "server_id": 7, "request_id": "req-0001", "arrived_at": ARRIVED, "trace_id": "a" * 32,
        "model": "tiny", "tenant": "acme", "template_id": 3, "template_version_id": 4, "source": "gateway",
        "client_ttft_seconds": 0.0513, "server_ttft_seconds": 0.0129, "queue_seconds": 4.8e-05,
        "prefill_seconds": 0.0067, "prompt_tokens": 2048, "cached_tokens": 1536, "completion_tokens": 16,
        "salt_hash": "5" * 64, "token_ids": tokens,
        "block_hashes": [wire_to_signed(block.wire) for block in block_hash_chain(tokens, 32)],
        "neutral_hashes": [wire_to_signed(block.wire) for block in block_hash_chain(tokens, 32)][::-1],
    }  # fmt: skip
    return RecordRow(**(values | fields))


NO_VALUES: dict[str, Any] = {
    "trace_id": "", "model": "", "tenant": "", "template_id": None, "template_version_id": None,
    "client_ttft_seconds": None, "server_ttft_seconds": None, "queue_seconds": None, "prefill_seconds": None,
    "prompt_tokens": None, "cached_tokens": None, "completion_tokens": None, "salt_hash": "",
    "block_hashes": [], "neutral_hashes": [], "token_ids": None,
}  # fmt: skip
AT_LIMITS: dict[str, Any] = {
    "server_id": INT8 - 1, "template_id": -INT8, "prompt_tokens": INT4 - 1, "cached_tokens": 0,
    "completion_tokens": -INT4, "block_hashes": [-INT8, -1, 0, 1, INT8 - 1],
    "token_ids": [-INT4, -1, 0, 1, INT4 - 1],
}  # fmt: skip
ROWS = [
    row(),
    row(request_id="req-0002", **NO_VALUES),  # NULLs wherever a column takes one, no hashes, no token ids
    row(  # a prompt shorter than a block: token ids, no hash; text beyond ASCII; another time zone
        request_id="req-0003-ü✓",
        tenant="tenant-é",
        token_ids=[5, 6, 7],
        block_hashes=[],
        arrived_at=ARRIVED.astimezone(timezone(timedelta(hours=-7))),
    ),
    row(request_id="req-0004", token_ids=[]),  # an empty array, not NULL
    row(request_id="req-0005", **AT_LIMITS),  # every integer at its type's limits
]


class Recorder(LibpqWriter):
    """Sends a COPY's data as psycopg does, and keeps a copy of it."""

    def __init__(self, cursor: Cursor[Any]) -> None:
        super().__init__(cursor)
        self.data = bytearray()

    def write(self, data: Buffer) -> None:
        self.data += data
        super().write(data)


def create_table(types: Sequence[str]) -> None:
    with connection.cursor() as cursor:
        columns = ", ".join(f"{column} {kind}" for column, kind in zip(COLUMNS, types, strict=True))
        cursor.execute(f"CREATE TEMP TABLE copied ({columns})")


def copied(types: Sequence[str], rows: Sequence[RecordRow], *, by_psycopg: bool = False) -> bytes:
    """The stream written for `rows` into the table `copied`: by write_rows, or by psycopg itself."""
    with connection.cursor() as cursor:
        recorder = Recorder(cursor.cursor)
        statement = f"COPY copied ({', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)"
        with cursor.cursor.copy(statement, writer=recorder) as copy:
            if by_psycopg:
                copy.set_types(types)
                for each in rows:
                    copy.write_row(each)
            else:
                write_rows(copy, rows, columns=COLUMNS, types=types)
    return bytes(recorder.data)


@pytest.mark.parametrize("table", sorted(TYPES))
def test_the_stream_is_psycopgs_own_byte_for_byte(table: str) -> None:
    create_table(TYPES[table])
    assert copied(TYPES[table], ROWS) == copied(TYPES[table], ROWS, by_psycopg=True)


@pytest.mark.parametrize("table", sorted(TYPES))
def test_the_rows_read_back_equal(table: str) -> None:
    create_table(TYPES[table])
    copied(TYPES[table], ROWS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(COLUMNS)} FROM copied ORDER BY request_id")
        assert [RecordRow._make(found) for found in cursor.fetchall()] == ROWS


def test_no_rows_make_an_empty_copy() -> None:
    create_table(TABLE_TYPES)
    assert copied(TABLE_TYPES, []) == copied(TABLE_TYPES, [], by_psycopg=True)


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("record table", "prompt_tokens", INT4),  # psycopg would write -2**31
        ("record table", "completion_tokens", -INT4 - 1),
        ("record table", "token_ids", [1, INT4, 2]),  # psycopg would write -2**31
        ("record table", "token_ids", [-INT4 - 1]),
        ("record table", "server_id", INT8),
        ("record table", "block_hashes", [INT8]),
        ("staging table", "block_hashes", [0, -INT8 - 1]),
        ("staging table", "token_ids", [INT8]),
        ("staging table", "cached_tokens", INT8),
    ],
)
def test_an_integer_that_does_not_fit_its_column_is_refused_and_nothing_is_written(
    table: str, column: str, value: object
) -> None:
    create_table(TYPES[table])
    rows = [ROWS[0], row(request_id="req-bad", **{column: value})]
    with (
        pytest.raises(NumericValueOutOfRange, match=f"^{column}: a value is out of range"),
        transaction.atomic(),
    ):
        copied(TYPES[table], rows)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM copied")
        assert cursor.fetchone()[0] == 0


def test_a_token_id_beyond_postgresqls_integer_fails_the_ingest_loudly() -> None:
    server = a_server(name="vllm-0", block_size=32)
    prompt = [1, 2, INT4, *range(61)]
    facts = RequestFacts(
        request_id="r-1", arrived_at=datetime.now(UTC), server=server.name, prompt_token_ids=prompt
    )

    with pytest.raises(DataError, match="token_ids: a value is out of range"):
        ingest_request_records([facts], source="gateway", now=datetime.now(UTC))
    assert not RequestRecord.objects.exists()
