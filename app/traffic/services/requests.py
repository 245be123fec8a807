"""The writer of request records: ingested in batches, merged by key, prompt tokens under retention.

A record's key is (server, request id, arrival time). Delivering the same record twice, or
two sources delivering parts of it (the gateway's cached tokens, a span's TTFT) under the same
key, leaves one row whose fields are the union of what arrived: a later value fills a gap,
it never erases a known one.
"""

import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import msgspec
from cachetools import TTLCache
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils.text import slugify
from psycopg.errors import CheckViolation, ForeignKeyViolation, UniqueViolation

from app.core.partitioning import forget_partition_ranges, recent_partition_ranges
from app.domain.blockhash import block_hash_chain, wire_to_signed
from app.fleet.models import Server
from app.prompts.models import Template, TemplateVersion
from app.traffic.models import RequestRecord
from app.traffic.services.kv_events import count_rejected_input

logger = logging.getLogger(__name__)

JOIN_WINDOW = timedelta(minutes=10)


class RequestIn(msgspec.Struct, frozen=True, kw_only=True):
    """One request record as a source reports it, validated but not yet resolved."""

    # A frozen msgspec Struct rather than a frozen dataclass: a batch builds thousands, and a
    # Struct is built several times faster (the REST endpoint spent more on these than on JSON).

    server: str  # a registered server's name, or its base URL
    request_id: str
    arrived_at: datetime
    source: str
    trace_id: str = ""
    model: str = ""
    tenant: str = ""
    template: str = ""
    template_version: str = ""  # the template repository's commit sha
    ttft_seconds: float | None = None
    queue_seconds: float | None = None
    prefill_seconds: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    cache_salt: str | None = None  # hashed here; the salt itself is never stored
    prompt_token_ids: Sequence[int] | None = None


@dataclass(frozen=True, slots=True)
class Malformed:
    """Input a source sent that could not become a record: counted with the ingested batch."""

    source: str
    reason: str  # bounded: which field and what is wrong with it, no values
    server: str = ""  # the server the input names (name or base URL), "" when it names none


@dataclass(slots=True)
class IngestOutcome:
    stored: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (index in the batch, reason)


# The staged columns and their types (binary COPY needs them). Counts and token ids are bigint
# while staged: a value beyond PostgreSQL's integer then fails loudly at the INSERT into the record
# table, where binary COPY straight into an integer column would wrap it round without a word.
_STAGED = (
    ("server_id", "int8"), ("request_id", "varchar"), ("arrived_at", "timestamptz"), ("trace_id", "varchar"),
    ("model", "varchar"), ("tenant", "varchar"), ("template_id", "int8"), ("template_version_id", "int8"),
    ("source", "varchar"), ("ttft_seconds", "float8"), ("queue_seconds", "float8"),
    ("prefill_seconds", "float8"), ("prompt_tokens", "int8"), ("cached_tokens", "int8"),
    ("completion_tokens", "int8"), ("salt_hash", "varchar"), ("block_hashes", "int8[]"),
    ("token_ids", "int8[]"),
)  # fmt: skip
_COLUMNS = tuple(column for column, _ in _STAGED)
_TYPES = tuple(kind for _, kind in _STAGED)
# The record table's own types, for binary COPY straight into it. Counts and token ids are int4
# there: every source checks them against PostgreSQL's integer first (app/api/schemas.py,
# collectors/usage), and psycopg refuses to dump a larger one as int4 rather than wrap it round.
_INT4 = {"prompt_tokens": "int4", "cached_tokens": "int4", "completion_tokens": "int4", "token_ids": "int4[]"}
_TABLE_TYPES = tuple(_INT4.get(column, kind) for column, kind in _STAGED)
_CREATE_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS request_record_batch "
    f"({', '.join(f'{column} {kind}' for column, kind in _STAGED)}) ON COMMIT DELETE ROWS"
)
_KEY = ("server_id", "request_id", "arrived_at")
_MERGE = ", ".join(
    f"{c} = COALESCE(NULLIF(EXCLUDED.{c}, ''), r.{c})"
    if c in ("trace_id", "model", "tenant", "salt_hash")
    else f"{c} = COALESCE(EXCLUDED.{c}, r.{c})"
    for c in _COLUMNS
    if c not in _KEY and c not in ("block_hashes", "source")
)
# Batches about one server take this transaction-level lock first (in server-id order, so two
# batches cannot deadlock): a batch then sees every record stored before it, and two batches about
# one request (arrivals seconds apart, from two sources) cannot both find nothing and both insert.
INGEST_LOCK_SPACE = 0x5245_5131  # pg_advisory_xact_lock's first key: request records' ingest
# Sources see a request arrive at slightly different moments (the gateway before vLLM's span
# starts): a record stored within JOIN_WINDOW under the same server and request id lends its
# arrival time, so that what arrives later merges into it.
_WINDOW = f"interval '{JOIN_WINDOW.total_seconds():.0f} seconds'"
_STORED_NEAR = f"""r.server_id = s.server_id AND r.request_id = s.request_id
  AND r.arrived_at BETWEEN s.arrived_at - {_WINDOW} AND s.arrived_at + {_WINDOW}"""
# Is a record of one server stored with one of these request ids, between the batch's earliest
# arrival less the window and its latest plus it? One descent of the primary key's index per id,
# and only the partitions of those days. A LATERAL with LIMIT, rather than `request_id = ANY (...)`:
# a day's partition has no statistics until autovacuum analyzes it, and the planner then scans the
# whole window of every server testing each row against the array (25 ms for 3,000 rows, growing),
# where this form can only look each id up (1.4 ms for a thousand ids, analyzed or not). The ids
# come as a JSON array: psycopg dumps a list as an array one element at a time (6 ms for a thousand
# ids). It can find a record near another key's time than its own: the batch is then merged, right
# either way.
_PROBE_SERVER = """EXISTS (SELECT FROM json_array_elements_text(%s::json) AS k (request_id)
  CROSS JOIN LATERAL (SELECT FROM traffic_requestrecord r WHERE r.server_id = %s
    AND r.request_id = k.request_id AND r.arrived_at BETWEEN %s AND %s LIMIT 1) AS stored)"""
_ALIGN_SQL = f"""
UPDATE request_record_batch s SET arrived_at = r.arrived_at
FROM traffic_requestrecord r WHERE {_STORED_NEAR} AND r.arrived_at <> s.arrived_at
"""
_UPSERT_SQL = f"""
INSERT INTO traffic_requestrecord AS r ({", ".join(_COLUMNS)})
SELECT DISTINCT ON ({", ".join(_KEY)}) {", ".join(_COLUMNS)} FROM request_record_batch
ON CONFLICT ({", ".join(_KEY)}) DO UPDATE SET {_MERGE},
    block_hashes = CASE WHEN cardinality(EXCLUDED.block_hashes) > 0
                        THEN EXCLUDED.block_hashes ELSE r.block_hashes END
"""


def ingest_request_records(
    items: Sequence[RequestIn], *, now: datetime, malformed: Sequence[Malformed] = ()
) -> IngestOutcome:
    """Store a batch in one transaction; items that cannot be stored are returned with the reason.

    Unknown servers are kept, as proposed servers for a person to register. Arrival times with no
    partition (past retention, or too far ahead) are rejected rather than failing the batch.
    `malformed` input is added to the tally of rejected input in the same transaction, under the
    server it names when that one is registered.
    OperationalError when PostgreSQL is away, or when the batch waits longer than
    PREFIXSCOPE_INGEST_LOCK_TIMEOUT_SECONDS for a lock (its cause then LockNotAvailable).
    """
    try:
        return _ingest(items, now=now, malformed=malformed, merge=False)
    except IntegrityError as exc:
        if isinstance(exc.__cause__, UniqueViolation):
            # A writer outside this function stored one of these keys after they were looked for.
            return _ingest(items, now=now, malformed=malformed, merge=True)
        if isinstance(exc.__cause__, ForeignKeyViolation | CheckViolation):
            # A server deleted, or a partition dropped, since this process looked them up.
            forget_servers()
            forget_partition_ranges()
            return _ingest(items, now=now, malformed=malformed, merge=False)
        raise


def _ingest(
    items: Sequence[RequestIn], *, now: datetime, malformed: Sequence[Malformed], merge: bool
) -> IngestOutcome:
    """One try at the batch; `merge` sends every record through alignment and merge."""
    outcome = IngestOutcome()
    with transaction.atomic():
        servers = _servers(items, named_by=malformed)
        spans = _spans(recent_partition_ranges(RequestRecord._meta.db_table).values())
        keep_since = _token_ids_kept_since(now)
        templates: dict[tuple[str, str], tuple[Template | None, TemplateVersion | None]] = {}
        rows = []
        unkept = _without_partition(items, spans)
        for index, item in enumerate(items):
            if index in unkept:
                outcome.rejected.append((index, "arrived_at: outside the kept window of request records"))
                continue
            server = servers[item.server]
            assert server is not None  # the items' servers are proposed when unknown
            rows.append(_row(item, server, keep_tokens_since=keep_since, templates=templates))
        _store(_deduplicated(rows), merge=merge)
        _count_malformed(malformed, servers, now=now)
    outcome.stored = len(rows)
    return outcome


def _count_malformed(
    malformed: Sequence[Malformed], servers: dict[str, Server | None], *, now: datetime
) -> None:
    tally = Counter((servers.get(m.server), m.source, m.reason) for m in malformed)
    for (server, source, reason), count in tally.items():
        count_rejected_input(
            server_id=server.pk if server else None, source=source, reason=reason, count=count, now=now
        )


def _spans(ranges: Iterable[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """Partition ranges joined where one ends as the next begins: one span, unless days are missing."""
    spans: list[tuple[datetime, datetime]] = []
    for lower, upper in sorted(ranges):
        if spans and spans[-1][1] == lower:
            spans[-1] = (spans[-1][0], upper)
        else:
            spans.append((lower, upper))
    return spans


def _without_partition(items: Sequence[RequestIn], spans: list[tuple[datetime, datetime]]) -> set[int]:
    """Indexes of the items whose arrival time no partition holds (past retention, too far ahead)."""
    arrivals = [item.arrived_at for item in items]
    if arrivals and spans and spans[0][0] <= min(arrivals) and max(arrivals) < spans[0][1]:
        return set()  # the usual batch, all in the first unbroken span: no test item by item
    return {
        index
        for index, arrived_at in enumerate(arrivals)
        if not any(lower <= arrived_at < upper for lower, upper in spans)
    }


# The server each reference (name or base URL) names, remembered by a process for this long: a
# source sends many batches a second about the same few servers, and looking them up took a tenth
# of an OTLP export's time. Only servers whose block size is known are remembered, so the one a
# scrape has just discovered is used from the next batch on; a block size changed by a redeploy is
# seen within these seconds. A batch naming a server deleted meanwhile is tried again without them.
SERVER_MEMORY_SECONDS = 10
_known_servers: TTLCache[str, Server] = TTLCache(maxsize=4096, ttl=SERVER_MEMORY_SECONDS)
_known_servers_lock = threading.Lock()


def forget_servers() -> None:
    with _known_servers_lock:
        _known_servers.clear()


def _servers(items: Sequence[RequestIn], *, named_by: Sequence[Malformed] = ()) -> dict[str, Server | None]:
    """The server each item (and each malformed input) names; a name or URL nobody registered
    becomes a proposed server for an item, and None for malformed input (no proposal from it).

    A name wins over a base URL; of several servers with one base URL, the first by name.
    """
    references = {item.server for item in items}
    named = {m.server for m in named_by if m.server} - references
    with _known_servers_lock:
        known = {ref: server for ref in references | named if (server := _known_servers.get(ref))}
    if len(known) == len(references | named):
        return dict(known)
    found = _look_up_servers(references - known.keys(), named - known.keys())
    with _known_servers_lock:
        _known_servers.update((ref, s) for ref, s in found.items() if s is not None and s.block_size)
    return known | found


def _look_up_servers(references: set[str], named: set[str]) -> dict[str, Server | None]:
    by_name: dict[str, Server] = {}
    by_url: dict[str, Server] = {}
    wanted = references | named
    for server in Server.objects.filter(Q(name__in=wanted) | Q(base_url__in=wanted)).order_by("name"):
        by_name[server.name] = server
        by_url.setdefault(server.base_url, server)
    found: dict[str, Server | None] = {ref: by_name.get(ref) or by_url.get(ref) for ref in named}
    return found | {ref: by_name.get(ref) or by_url.get(ref) or _propose(ref) for ref in references}


def _propose(reference: str) -> Server:
    is_url = "://" in reference
    name = slugify(urlsplit(reference).netloc if is_url else reference)[:100] or "unnamed"
    server, created = Server.objects.get_or_create(
        name=name, defaults={"base_url": reference if is_url else "", "state": Server.State.PROPOSED}
    )
    if created:
        logger.info("proposed server %s, seen in ingested requests", name)
    return server


def _row(
    item: RequestIn,
    server: Server,
    *,
    keep_tokens_since: datetime | None,
    templates: dict[tuple[str, str], tuple[Template | None, TemplateVersion | None]],
) -> tuple[Any, ...]:
    # One lookup per template and version in a batch, not per record.
    key = (item.template, item.template_version)
    if key not in templates:
        templates[key] = _template(item)
    template, version = templates[key]
    tokens = list(item.prompt_token_ids) if item.prompt_token_ids is not None else None
    hashes: list[int] = []
    if tokens and server.block_size:
        hashes = [
            wire_to_signed(h.wire)
            for h in block_hash_chain(tokens, server.block_size, cache_salt=item.cache_salt)
        ]
    if keep_tokens_since is None or item.arrived_at < keep_tokens_since:
        tokens = None
    salt_hash = hashlib.sha256(item.cache_salt.encode()).hexdigest() if item.cache_salt else ""
    return (
        server.pk, item.request_id, item.arrived_at, item.trace_id, item.model, item.tenant,
        template.pk if template else None, version.pk if version else None, item.source,
        item.ttft_seconds, item.queue_seconds, item.prefill_seconds, item.prompt_tokens,
        item.cached_tokens, item.completion_tokens, salt_hash, hashes, tokens,
    )  # fmt: skip


def _token_ids_kept_since(now: datetime) -> datetime | None:
    """Token ids of requests that arrived since then are kept; None in hash-only mode."""
    if settings.PREFIXSCOPE_HASH_ONLY:
        return None
    return now - timedelta(days=settings.PREFIXSCOPE_TOKEN_RETENTION_DAYS)


def _template(item: RequestIn) -> tuple[Template | None, TemplateVersion | None]:
    """The named template and version; a commit not imported yet is recorded as first seen now."""
    if not item.template:
        return None, None
    template, _ = Template.objects.get_or_create(name=item.template, defaults={"tenant": item.tenant})
    if not item.template_version:
        return template, None
    version, _ = TemplateVersion.objects.get_or_create(
        template=template,
        commit_sha=item.template_version,
        defaults={
            "committed_at": item.arrived_at,
            "message": "seen in traffic before its commit was imported",
        },
    )
    return template, version


def _deduplicated(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    # ON CONFLICT cannot touch one row twice in a statement: merge repeats inside a batch first.
    merged: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in rows:
        earlier = merged.get(row[:3])
        merged[row[:3]] = row if earlier is None else tuple(map(_known, earlier, row))
    return list(merged.values())


def _known(earlier: Any, later: Any) -> Any:
    return earlier if later is None or later == "" or later == [] else later


def _store(rows: list[tuple[Any, ...]], *, merge: bool) -> None:
    """COPY the rows straight into the table when none has a record stored near its key (the usual
    case), else stage them, align them to the stored arrival times and merge them.

    Under the servers' ingest locks, so every record stored by another batch is seen. Without
    `merge`, a writer that bypasses them and stores one of the keys after the probe makes the COPY
    raise IntegrityError (UniqueViolation): the caller then runs again with `merge`.
    """
    if not rows:
        return
    with connection.cursor() as cursor:
        by_server: dict[int, list[tuple[Any, ...]]] = {}
        for row in rows:
            by_server.setdefault(row[0], []).append(row)
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
        _copy(cursor, "traffic_requestrecord", _TABLE_TYPES, rows)


def stored_near_probe(by_server: dict[int, list[tuple[Any, ...]]]) -> tuple[str, list[Any]]:
    """The statement (and its parameters) answering whether a record is stored near any of the
    rows' keys, for rows grouped by server id."""
    parameters: list[Any] = []
    for server_id, rows in sorted(by_server.items()):
        times = [row[2] for row in rows]
        ids = msgspec.json.encode([row[1] for row in rows]).decode()
        parameters += [ids, server_id, min(times) - JOIN_WINDOW, max(times) + JOIN_WINDOW]
    return "SELECT " + " OR ".join([_PROBE_SERVER] * len(by_server)), parameters


def _merge(cursor: Any, rows: list[tuple[Any, ...]]) -> None:
    # Emptied at commit; DELETE (not TRUNCATE: no new file each time) for a caller's outer
    # transaction that has not committed yet.
    cursor.execute(f"{_CREATE_STAGING}; DELETE FROM request_record_batch")
    _copy(cursor, "request_record_batch", _TYPES, rows)
    cursor.execute(_ALIGN_SQL)
    cursor.execute(_UPSERT_SQL)


def _copy(cursor: Any, table: str, types: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
    # Through psycopg's own cursor: its errors wrapped as Django's (IntegrityError, OperationalError)
    # by hand, as Django's cursor does for the statements it runs.
    columns = ", ".join(_COLUMNS)
    with (
        connection.wrap_database_errors,
        cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


def expire_token_ids(*, now: datetime) -> int:
    """Forget prompt token ids past their retention (all of them in hash-only mode).

    Block hashes stay: divergence still works to block precision. Returns rows changed.
    """
    records = RequestRecord.objects.filter(token_ids__isnull=False)
    if not settings.PREFIXSCOPE_HASH_ONLY:
        cutoff = now - timedelta(days=settings.PREFIXSCOPE_TOKEN_RETENTION_DAYS)
        records = records.filter(arrived_at__lt=cutoff)
    changed = records.update(token_ids=None)
    if changed:
        logger.info("token ids expired", extra={"records": changed})
    return changed
