"""The writer of request records: ingested in batches, merged by key, prompt tokens under retention.

Every source hands in `RequestFacts` (collectors/records.py) under its canonical request id. A
record's key is (server, request id, arrival time); sources see a request arrive moments apart (the
gateway before vLLM's span starts), so facts of one server and request id that arrive within
JOIN_WINDOW of a stored record take its arrival time and merge into it, in one batch as across
batches. Records with different request ids never merge. A merge is the union of what arrived: a
later value fills a gap, it never erases a known one with nothing.

A record without template metadata is in the prefix family of its leading blocks (app/prompts
models.py PrefixFamily), and carries the template that family is bound to; a record with template
metadata (its own, or merged in from another source) has no family.
"""

import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
from cachetools import TTLCache
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from psycopg.errors import CheckViolation, ForeignKeyViolation, NumericValueOutOfRange, UniqueViolation

from app.domain.blockhash import TokenIds, int64_ids, signed_block_hashes
from app.domain.retention import keeps_token_ids, token_ids_cutoff
from app.fleet.models import Server
from app.fleet.selectors import UNKNOWN_MODEL_REASON, UnknownModel, request_lora
from app.fleet.services import servers_named
from app.prompts.models import Template, TemplateVersion
from app.prompts.services import template_version_seen
from app.traffic.models import RequestRecord
from app.traffic.services.copy_rows import write_rows
from app.traffic.services.families import record_families
from app.traffic.services.partitions import day_of, ensure_day_partitions, forget_partition_ranges
from app.traffic.services.rejections import count_rejected_input
from collectors.records import SERVER_MAX, RequestFacts, problem

logger = logging.getLogger(__name__)

JOIN_WINDOW = timedelta(minutes=10)


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
}  # fmt: skip
_INT4 = {"prompt_tokens": "int4", "cached_tokens": "int4", "completion_tokens": "int4", "token_ids": "int4[]"}
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
    if c in ("trace_id", "model", "tenant", "salt_hash")
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
# spans alone saw it (app/traffic/models.py span_only_sql).
SOURCE_MERGE = "source = CASE WHEN r.source = 'otlp' THEN {0}.source ELSE r.source END"
_UPSERT_SQL = f"""
INSERT INTO traffic_requestrecord AS r ({", ".join(_COLUMNS)})
SELECT DISTINCT ON ({", ".join(_KEY)}) {", ".join(_COLUMNS)} FROM request_record_batch
ON CONFLICT ({", ".join(_KEY)}) DO UPDATE SET {_MERGE}, {_CHAIN_MERGE}, {_TEMPLATE_MERGE},
  {SOURCE_MERGE.format("EXCLUDED")}
"""


def ingest_request_records(
    facts: Sequence[RequestFacts],
    *,
    source: str,
    now: datetime,
    default_server: str = "",
    malformed: Sequence[Malformed] = (),
) -> IngestOutcome:
    """Store a batch from one source in one transaction; facts that cannot be stored are returned
    with the reason (the field at fault), and counted as rejected input with `malformed`.

    A record names its server (a name or base URL), else `default_server`; unknown servers are kept
    as proposed servers for a person to accept. A record inside the request retention whose day
    has no partition yet gets one; older ones, and ones too far ahead, are rejected.
    OperationalError when PostgreSQL is away, or when the batch waits longer than
    PREFIXSCOPE_INGEST_LOCK_TIMEOUT_SECONDS for a lock (its cause then LockNotAvailable).
    """
    items, rejected = _checked(facts, default_server=default_server, now=now)
    refused = [*malformed, *(Malformed(source, reason, server) for _, reason, server in rejected)]
    merge = False
    for retry in (False, True):
        ensure_day_partitions(RequestRecord, [item.arrived_at for item in items])
        try:
            stored = _ingest(items, source=source, now=now, malformed=refused, merge=merge)
            break
        except IntegrityError as exc:
            if retry:
                raise
            if isinstance(exc.__cause__, UniqueViolation):
                merge = True  # a writer outside this function stored one of the keys after the probe
            elif isinstance(exc.__cause__, ForeignKeyViolation | CheckViolation):
                # A server deleted, or a partition dropped, since this process looked them up.
                forget_servers()
                forget_partition_ranges()
            else:
                raise
    return IngestOutcome(stored=stored, rejected=[(index, reason) for index, reason, _ in rejected])


def _checked(
    facts: Sequence[RequestFacts], *, default_server: str, now: datetime
) -> tuple[list[RequestFacts], list[tuple[int, str, str]]]:
    """The facts that can be stored (their server filled in), and the others: (index, reason, server)."""
    oldest = now - timedelta(days=settings.PREFIXSCOPE_REQUEST_RETENTION_DAYS)
    newest = day_of(now) + timedelta(days=settings.PREFIXSCOPE_PARTITIONS_AHEAD_DAYS + 1)
    items, rejected = [], []
    for index, item in enumerate(facts):
        if not item.server:
            item = msgspec.structs.replace(item, server=default_server)
        reason = problem(item) or _outside_retention(item.arrived_at, oldest=oldest, newest=newest)
        if reason:
            rejected.append((index, reason, item.server if len(item.server) <= SERVER_MAX else ""))
        else:
            items.append(item)
    return items, rejected


def _outside_retention(arrived_at: datetime, *, oldest: datetime, newest: datetime) -> str | None:
    if arrived_at < oldest:
        days = settings.PREFIXSCOPE_REQUEST_RETENTION_DAYS
        return f"arrived_at: older than the request records' retention ({days} days)"
    if arrived_at >= newest:
        return "arrived_at: further ahead than the request records' partitions"
    return None


def _ingest(
    items: Sequence[RequestFacts],
    *,
    source: str,
    now: datetime,
    malformed: Sequence[Malformed],
    merge: bool,
) -> int:
    """One try at the batch; `merge` sends every record through alignment and merge. Returns rows.

    The prompts' block hashes are computed by a thread of their own (_hashed_ahead) while the
    lookups and the transaction's first round trip wait on the database, and the rows are built
    from them as the COPY takes them. Servers, templates and versions, and prefix families, are
    looked up (made when new) before the batch's transaction, each in its own: two batches naming
    the same new templates in their own orders deadlocked on them (a gateway in front of several
    servers runs one writer per server).
    """
    servers = _servers(items, named_by=malformed)
    located = _deduplicated([(_known_server(servers, item), item) for item in items])
    with _hashed_ahead(located) as prompts:
        templates = _templates(item for _, item in located)  # merged facts may pair a template anew
        families = record_families(located)
        with transaction.atomic():
            cutoff = token_ids_cutoff(
                now, days=settings.PREFIXSCOPE_TOKEN_RETENTION_DAYS, hash_only=settings.PREFIXSCOPE_HASH_ONLY
            )
            unhashed: list[Malformed] = []

            def rows() -> Iterator[RecordRow]:
                for (server, item), family, (ids, chains) in zip(located, families, prompts, strict=True):
                    if chains is None:  # stored without block hashes, rather than with a chain matching none
                        unhashed.append(Malformed(source, UNKNOWN_MODEL_REASON, item.server))
                    template, version = templates[item.template, item.template_version]
                    family_id, bound = family or (None, None)
                    yield _row(
                        item, server, chains or ([], []), ids, source=source, token_ids_cutoff=cutoff,
                        template_id=template.pk if template else bound,
                        template_version_id=version.pk if version else None, family_id=family_id,
                    )  # fmt: skip

            keys = [(server.pk, item.request_id, item.arrived_at) for server, item in located]
            _store(keys, rows(), merge=merge)
            _count_malformed([*malformed, *unhashed], servers, now=now)
    return len(items)


class _Prompt(NamedTuple):
    """A record's prompt as its row stores it: the token ids as int64 (converted once, for hashing and
    for storing), and its chains (_chains: None when its server serves no model of its name)."""

    ids: npt.NDArray[np.int64] | None
    chains: tuple[list[int], list[int]] | None


# Records hashed per task of the hashing thread: a task costs little against hashing them, and
# the COPY waits for no more than one task's worth before its first row.
_HASHED_PER_TASK = 16


@contextmanager
def _hashed_ahead(located: Sequence[tuple[Server, RequestFacts]]) -> Iterator[Iterator[_Prompt]]:
    """Each record's _Prompt, in the records' order, computed from the moment the block is entered
    by one thread of its own when any record has token ids (their hashing, in C, runs without the
    GIL, beside whatever waits on the database meanwhile); in place as they are taken otherwise.

    Taking a record whose computation raised raises that same error, as computing it in place
    would. Leaving the block cancels what has not started, and waits for what has.
    """
    if all(item.prompt_token_ids is None for _, item in located):
        yield (_prompt(server, item) for server, item in located)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-hashes") as pool:
        tasks = [
            pool.submit(_prompts, located[start : start + _HASHED_PER_TASK])
            for start in range(0, len(located), _HASHED_PER_TASK)
        ]
        try:
            yield (prompt for task in tasks for prompt in task.result())
        finally:
            for task in tasks:
                task.cancel()


def _prompts(located: Sequence[tuple[Server, RequestFacts]]) -> list[_Prompt]:
    return [_prompt(server, item) for server, item in located]


def _prompt(server: Server, item: RequestFacts) -> _Prompt:
    """NumericValueOutOfRange (a DataError, as the COPY raises for a token id beyond int4) for a
    token id beyond int64: the batch fails, and a writer that then stores its records one by one
    rejects that record alone."""
    try:
        ids = int64_ids(item.prompt_token_ids) if item.prompt_token_ids is not None else None
    except OverflowError:
        raise NumericValueOutOfRange("token_ids: a value is out of range for int4[]") from None
    return _Prompt(ids, _chains(item, ids, server))


def _known_server(servers: dict[str, Server | None], item: RequestFacts) -> Server:
    server = servers[item.server]
    assert server is not None  # the items' servers are proposed when unknown
    return server


def _templates(
    items: Iterable[RequestFacts],
) -> dict[tuple[str, str], tuple[Template | None, TemplateVersion | None]]:
    """The template and version each (template, version) named in the batch is: one lookup each, in
    sorted order (so that writers making the same new ones wait for each other, never deadlock)."""
    first = {(item.template, item.template_version): item for item in reversed(list(items))}
    found: dict[tuple[str, str], tuple[Template | None, TemplateVersion | None]] = {}
    for key in sorted(first):
        item = first[key]
        found[key] = template_version_seen(
            template=item.template, version=item.template_version, tenant=item.tenant, seen_at=item.arrived_at
        )
    return found


def _count_malformed(
    malformed: Sequence[Malformed], servers: dict[str, Server | None], *, now: datetime
) -> None:
    tally = Counter((servers.get(m.server), m.source, m.reason) for m in malformed)
    for (server, source, reason), count in tally.items():
        count_rejected_input(
            server_id=server.pk if server else None, source=source, reason=reason, count=count, now=now
        )


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


def _servers(
    items: Sequence[RequestFacts], *, named_by: Sequence[Malformed] = ()
) -> dict[str, Server | None]:
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
    found = servers_named(references - known.keys(), propose_unknown=True)
    found |= servers_named(named - known.keys(), propose_unknown=False)
    with _known_servers_lock:
        _known_servers.update((ref, s) for ref, s in found.items() if s is not None and s.block_size)
    return known | found


def _chains(
    item: RequestFacts, ids: npt.NDArray[np.int64] | None, server: Server
) -> tuple[list[int], list[int]] | None:
    """The prompt's block hashes as its server computed them (its block size, the request's salt
    and LoRA adapter), and for a salted prompt the same chain without its salt (so that, token ids
    gone, a salt's misses can still be told from cold ones), as signed bigints. Both [] without
    token ids (`ids`, the prompt's as int64) or a known block size; None when the server serves no
    model of the request's name."""
    if ids is None or not len(ids) or not server.block_size:
        return [], []
    try:
        lora = request_lora(server, item.model)
    except UnknownModel:
        return None
    hashes = signed_block_hashes(ids, server.block_size, cache_salt=item.cache_salt, lora=lora)
    neutral = signed_block_hashes(ids, server.block_size, lora=lora) if item.cache_salt else []
    return hashes, neutral


def _row(
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
    )


def _deduplicated(located: list[tuple[Server, RequestFacts]]) -> list[tuple[Server, RequestFacts]]:
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


def _store(keys: Sequence[tuple[int, str, datetime]], rows: Iterable[RecordRow], *, merge: bool) -> None:
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


def expire_token_ids(*, now: datetime) -> int:
    """Forget prompt token ids past their retention (all of them in hash-only mode).

    Block hashes stay: divergence still works to block precision. Returns rows changed.
    """
    cutoff = token_ids_cutoff(
        now, days=settings.PREFIXSCOPE_TOKEN_RETENTION_DAYS, hash_only=settings.PREFIXSCOPE_HASH_ONLY
    )
    records = RequestRecord.objects.filter(token_ids__isnull=False)
    if cutoff is not None:
        records = records.filter(arrived_at__lt=cutoff)
    changed = records.update(token_ids=None)
    if changed:
        logger.info("token ids expired", extra={"records": changed})
    return changed
