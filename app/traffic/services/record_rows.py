"""The request records' rows as the ingest writes them (services/requests.py): their columns and
COPY types, facts merged by key within a batch, and the statements that COPY them in or stage,
align and merge them into records stored near their keys."""

import hashlib
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
from django.conf import settings
from django.db import connection

from app.domain.blockhash import TokenIds
from app.domain.retention import keeps_token_ids
from app.fleet.models import Server
from app.traffic.services.copy_rows import write_rows
from collectors.records import RequestFacts

JOIN_WINDOW = timedelta(minutes=10)


class RecordRow(NamedTuple):
    """One request record as it is written: the table's columns, in COPY order."""

    server_id: int
    request_id: str
    arrived_at: datetime
    trace_id: str
    model: str
    tenant: str
    template_id: int | None
    template_version_id: int | None
    source: str
    client_ttft_seconds: float | None
    server_ttft_seconds: float | None
    queue_seconds: float | None
    prefill_seconds: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    salt_hash: str
    block_hashes: list[int]
    neutral_hashes: list[int]  # the chain without the salt; [] when unsalted (the same chain)
    token_ids: TokenIds | None  # numpy int64 from the ingest (its token id lists converted once)
    family_id: int | None = None  # the prefix family of a record without template metadata
    provider: str = ""  # a hosted API (collectors.records.HOSTED_PROVIDERS); "" self-hosted
    cache_write_tokens: int | None = None
    cache_ttl_seconds: int | None = None
    cache_key_hash: str = ""
    cache_breakpoints: list[int] | None = None
    gateway_cache_hit: bool | None = None
    part_digests: dict[str, Any] | None = None  # PartDigests as JSON (collectors/parts.py), as stored


# Each column's type for binary COPY, into the staging table (counts and token ids bigint there: a
# value beyond PostgreSQL's integer then fails at the INSERT) and into the record table itself
# (copy_rows.write_rows refuses an integer its column cannot hold: psycopg's binary dumpers would
# wrap an int4 round).
_STAGED_TYPES = {
    "server_id": "int8", "request_id": "varchar", "arrived_at": "timestamptz", "trace_id": "varchar",
    "model": "varchar", "tenant": "varchar", "template_id": "int8", "template_version_id": "int8",
    "source": "varchar", "client_ttft_seconds": "float8", "server_ttft_seconds": "float8",
    "queue_seconds": "float8", "prefill_seconds": "float8", "prompt_tokens": "int8",
    "cached_tokens": "int8", "completion_tokens": "int8", "salt_hash": "varchar",
    "block_hashes": "int8[]", "neutral_hashes": "int8[]", "token_ids": "int8[]", "family_id": "int8",
    "provider": "varchar", "cache_write_tokens": "int8", "cache_key_hash": "varchar",
    "cache_breakpoints": "int8[]", "gateway_cache_hit": "bool", "cache_ttl_seconds": "int8",
    "part_digests": "jsonb",
}  # fmt: skip
_INT4 = {"prompt_tokens": "int4", "cached_tokens": "int4", "completion_tokens": "int4", "token_ids": "int4[]",
         "cache_write_tokens": "int4", "cache_breakpoints": "int4[]",
         "cache_ttl_seconds": "int4"}  # fmt: skip
_COLUMNS = RecordRow._fields
_TYPES = tuple(_STAGED_TYPES[column] for column in _COLUMNS)
TABLE_TYPES = tuple(_INT4.get(column, _STAGED_TYPES[column]) for column in _COLUMNS)
"""The binary COPY types of RecordRow's columns in traffic_requestrecord (the ingest benches' baseline
records its stream with them)."""
_CREATE_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS request_record_batch "
    f"({', '.join(f'{column} {_STAGED_TYPES[column]}' for column in _COLUMNS)}) ON COMMIT DELETE ROWS"
)
_KEY = ("server_id", "request_id", "arrived_at")
_CHAINS = ("block_hashes", "neutral_hashes")  # a later source's chain replaces one only when it has one
_MERGE = ", ".join(
    f"{c} = COALESCE(NULLIF(EXCLUDED.{c}, ''), r.{c})"
    if c in ("trace_id", "model", "tenant", "salt_hash", "provider", "cache_key_hash")
    else f"{c} = COALESCE(EXCLUDED.{c}, r.{c})"
    for c in _COLUMNS
    if c not in _KEY and c not in (*_CHAINS, "source", "template_id", "family_id")
)
# A template named by a record's own metadata (not one its family is bound to) wins over a family:
# the merged record then has that template and no family.
_OWN = "({0}.template_id IS NOT NULL AND {0}.family_id IS NULL)"
_TEMPLATE_MERGE = f"""template_id = CASE WHEN {_OWN.format("r")} AND NOT {_OWN.format("EXCLUDED")}
  THEN r.template_id ELSE COALESCE(EXCLUDED.template_id, r.template_id) END,
family_id = CASE WHEN {_OWN.format("r")} OR {_OWN.format("EXCLUDED")}
  THEN NULL ELSE COALESCE(EXCLUDED.family_id, r.family_id) END"""
# Batches about one server take this transaction-level lock first (in server-id order, so two
# batches cannot deadlock): a batch then sees every record stored before it, and two batches about
# one request (arrivals seconds apart, from two sources) cannot both find nothing and both insert.
INGEST_LOCK_SPACE = 0x5245_5131  # pg_advisory_xact_lock's first key: request records' ingest
_WINDOW = f"interval '{JOIN_WINDOW.total_seconds():.0f} seconds'"
_STORED_NEAR = f"""r.server_id = s.server_id AND r.request_id = s.request_id
  AND r.arrived_at BETWEEN s.arrived_at - {_WINDOW} AND s.arrived_at + {_WINDOW}"""
# Is a record of one server stored with one of these request ids, between the batch's earliest
# arrival less the window and its latest plus it? One descent of the primary key's index per id, in
# the partitions of those days only. LATERAL ... LIMIT 1, not `request_id = ANY (...)`: a new day's
# partition has no statistics, and the planner then scans the whole window of every server
# (bench/bench_rest_ingest.py). The ids come as one JSON array (psycopg dumps a list element by
# element). A record near another key's time sends the batch to merge, which is right either way.
_PROBE_SERVER = """EXISTS (SELECT FROM json_array_elements_text(%s::json) AS k (request_id)
  CROSS JOIN LATERAL (SELECT FROM traffic_requestrecord r WHERE r.server_id = %s
    AND r.request_id = k.request_id AND r.arrived_at BETWEEN %s AND %s LIMIT 1) AS stored)"""
_ALIGN_SQL = f"""
UPDATE request_record_batch s SET arrived_at = r.arrived_at
FROM traffic_requestrecord r WHERE {_STORED_NEAR} AND r.arrived_at <> s.arrived_at
"""
_CHAIN_MERGE = ", ".join(
    f"{c} = CASE WHEN cardinality(EXCLUDED.{c}) > 0 THEN EXCLUDED.{c} ELSE r.{c} END" for c in _CHAINS
)
# A record's source is the first that saw it, but a span's gives way to any other: "otlp" then says
# spans alone saw it (app/traffic/models/raw.py span_only_sql).
SOURCE_MERGE = "source = CASE WHEN r.source = 'otlp' THEN {0}.source ELSE r.source END"
_UPSERT_SQL = f"""
INSERT INTO traffic_requestrecord AS r ({", ".join(_COLUMNS)})
SELECT DISTINCT ON ({", ".join(_KEY)}) {", ".join(_COLUMNS)} FROM request_record_batch
ON CONFLICT ({", ".join(_KEY)}) DO UPDATE SET {_MERGE}, {_CHAIN_MERGE}, {_TEMPLATE_MERGE},
  {SOURCE_MERGE.format("EXCLUDED")}
"""


def record_row(
    item: RequestFacts,
    server: Server,
    chains: tuple[list[int], list[int]],
    token_ids: npt.NDArray[np.int64] | None,
    *,
    source: str,
    token_ids_cutoff: datetime | None,
    template_id: int | None,
    template_version_id: int | None,
    family_id: int | None,
) -> RecordRow:
    return RecordRow(
        server_id=server.pk,
        request_id=item.request_id,
        arrived_at=item.arrived_at,
        trace_id=item.trace_id,
        model=item.model,
        tenant=item.tenant,
        template_id=template_id,
        template_version_id=template_version_id,
        source=source,
        client_ttft_seconds=item.client_ttft_seconds,
        server_ttft_seconds=item.server_ttft_seconds,
        queue_seconds=item.queue_seconds,
        prefill_seconds=item.prefill_seconds,
        prompt_tokens=item.prompt_tokens,
        cached_tokens=item.cached_tokens,
        completion_tokens=item.completion_tokens,
        salt_hash=hashlib.sha256(item.cache_salt.encode()).hexdigest() if item.cache_salt else "",
        block_hashes=chains[0],
        neutral_hashes=chains[1],
        token_ids=token_ids if keeps_token_ids(item.arrived_at, token_ids_cutoff) else None,
        family_id=family_id,
        provider=item.provider,
        cache_write_tokens=item.cache_write_tokens,
        cache_ttl_seconds=item.cache_ttl_seconds,
        cache_key_hash=_hashed(item.prompt_cache_key),
        cache_breakpoints=list(item.cache_breakpoints) if item.cache_breakpoints is not None else None,
        gateway_cache_hit=item.gateway_cache_hit,
        part_digests=msgspec.to_builtins(item.parts) if item.parts is not None else None,
    )


def _hashed(secret: str | None) -> str:
    return hashlib.sha256(secret.encode()).hexdigest() if secret else ""


def deduplicated(located: list[tuple[Server, RequestFacts]]) -> list[tuple[Server, RequestFacts]]:
    """Facts of one server and request id arriving within JOIN_WINDOW of the first of them merged
    into it (as a later batch's would be): ON CONFLICT cannot touch one row twice in a statement."""
    if len({(server.pk, item.request_id) for server, item in located}) == len(located):
        return located  # the usual batch: no request twice
    kept: dict[tuple[int, str], list[tuple[Server, RequestFacts]]] = {}
    for server, item in located:
        earlier = kept.setdefault((server.pk, item.request_id), [])
        for position, (_, first) in enumerate(earlier):
            if abs(item.arrived_at - first.arrived_at) <= JOIN_WINDOW:
                earlier[position] = (server, _merged(first, item))
                break
        else:
            earlier.append((server, item))
    return [pair for pairs in kept.values() for pair in pairs]


def _merged(first: RequestFacts, later: RequestFacts) -> RequestFacts:
    """The union of two sources' facts of one request, at the first's arrival: a later value fills
    a gap, it never erases a known one with nothing."""
    given = {
        name: value
        for name in RequestFacts.__struct_fields__
        if name != "arrived_at" and _given(value := getattr(later, name))
    }
    return msgspec.structs.replace(first, **given)


def _given(value: Any) -> bool:
    if isinstance(value, list | tuple | np.ndarray):  # token ids: a list, or numpy from REST
        return len(value) > 0
    return value is not None and value != ""


def store_records(
    keys: Sequence[tuple[int, str, datetime]], rows: Iterable[RecordRow], *, merge: bool
) -> None:
    """COPY the rows straight into the table when none has a record stored near its key (the usual
    case), else stage them, align them to the stored arrival times and merge them.

    Under the servers' ingest locks, so every record stored by another batch is seen. Without
    `merge`, a writer that bypasses them and stores one of the keys after the probe makes the COPY
    raise IntegrityError (UniqueViolation): the caller then runs again with `merge`.
    """
    if not keys:
        return
    with connection.cursor() as cursor:
        by_server: dict[int, list[tuple[str, datetime]]] = {}
        for server_id, request_id, arrived_at in keys:
            by_server.setdefault(server_id, []).append((request_id, arrived_at))
        # One round trip: the lock timeout (waiting longer for a lock, here or on a key the COPY
        # meets, raises LockNotAvailable), the locks, then the probe in a statement of its own (its
        # snapshot is taken after the locks are held, so it sees what the batches before this one
        # committed). A collision of two servers' keys (ids beyond 2**31) would only serialise them.
        timeout = f"SET LOCAL lock_timeout = '{settings.PREFIXSCOPE_INGEST_LOCK_TIMEOUT_SECONDS}s';"
        locks = "".join(
            f"SELECT pg_advisory_xact_lock({INGEST_LOCK_SPACE}, {pk % 2**31});" for pk in sorted(by_server)
        )
        probe, parameters = stored_near_probe(by_server)
        cursor.execute(f"{timeout} {locks} {probe}", parameters)
        while cursor.nextset():
            pass  # on to the probe's answer, the last
        if merge or cursor.fetchone()[0]:
            _merge(cursor, rows)
            return
        _copy(cursor, "traffic_requestrecord", TABLE_TYPES, rows)


def stored_near_probe(by_server: dict[int, list[tuple[str, datetime]]]) -> tuple[str, list[Any]]:
    """The statement (and its parameters) answering whether a record is stored near any of the
    keys, (request id, arrival time) grouped by server id."""
    parameters: list[Any] = []
    for server_id, keys in sorted(by_server.items()):
        times = [arrived_at for _, arrived_at in keys]
        ids = msgspec.json.encode([request_id for request_id, _ in keys]).decode()
        parameters += [ids, server_id, min(times) - JOIN_WINDOW, max(times) + JOIN_WINDOW]
    return "SELECT " + " OR ".join([_PROBE_SERVER] * len(by_server)), parameters


def _merge(cursor: Any, rows: Iterable[RecordRow]) -> None:
    # Emptied at commit; DELETE (not TRUNCATE: no new file each time) for a caller's outer
    # transaction that has not committed yet.
    cursor.execute(f"{_CREATE_STAGING}; DELETE FROM request_record_batch")
    _copy(cursor, "request_record_batch", _TYPES, rows)
    cursor.execute(_ALIGN_SQL)
    cursor.execute(_UPSERT_SQL)


def _copy(cursor: Any, table: str, types: Sequence[str], rows: Iterable[RecordRow]) -> None:
    # Through psycopg's own cursor: its errors wrapped as Django's (IntegrityError, OperationalError)
    # by hand, as Django's cursor does for the statements it runs.
    # The arrays (token ids, block hashes) are encoded whole by copy_rows, not element by element.
    columns = ", ".join(_COLUMNS)
    with (
        connection.wrap_database_errors,
        cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        write_rows(copy, rows, columns=_COLUMNS, types=types)
