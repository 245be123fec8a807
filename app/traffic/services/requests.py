"""The writer of request records: ingested in batches, merged by key, prompt tokens under retention.

Every source hands in `RequestFacts` (collectors/records.py) under its canonical request id. A
record's key is (server, request id, arrival time); sources see a request arrive moments apart (the
gateway before vLLM's span starts), so facts of one server and request id that arrive within
JOIN_WINDOW (record_rows.py) of a stored record take its arrival time and merge into it, in one
batch as across batches. Records with different request ids never merge. A merge is the union of
what arrived: a later value fills a gap, it never erases a known one with nothing.

A record without template metadata is in the prefix family of its leading blocks (app/prompts
models.py PrefixFamily), and carries the template that family is bound to; a record with template
metadata (its own, or merged in from another source) has no family.
"""

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
from cachetools import TTLCache
from django.conf import settings
from django.db import IntegrityError, transaction
from psycopg.errors import CheckViolation, ForeignKeyViolation, NumericValueOutOfRange, UniqueViolation

from app.domain.blockhash import int64_ids, signed_block_hashes
from app.domain.hosted import content_chain
from app.domain.retention import token_ids_cutoff
from app.fleet.models import Server
from app.fleet.selectors import UNKNOWN_MODEL_REASON, UnknownModel, request_lora
from app.fleet.services import servers_named
from app.prompts.models import Template, TemplateVersion
from app.prompts.services import template_version_seen
from app.traffic.models import RequestRecord
from app.traffic.services.arrivals import count_received_records
from app.traffic.services.families import record_families
from app.traffic.services.partitions import day_of, ensure_day_partitions, forget_partition_ranges
from app.traffic.services.record_rows import RecordRow, deduplicated, record_row, store_records
from app.traffic.services.rejections import count_rejected_input
from collectors.errors import Rejection, RejectReason
from collectors.records import SERVER_MAX, RequestFacts, problem

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Malformed:
    """Input a source sent that could not become a record: counted with the ingested batch."""

    source: str
    code: RejectReason  # the tally's reason
    detail: str  # which field and what is wrong with it, no values
    server: str = ""  # the server the input names (name or base URL), "" when it names none


@dataclass(slots=True)
class IngestOutcome:
    stored: int = 0
    rejected: list[tuple[int, Rejection]] = field(default_factory=list)  # (index in the batch, why)


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
    refused = [*malformed, *(Malformed(source, why.code, why.detail, server) for _, why, server in rejected)]
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
    _count_arrivals(stored, source=source, now=now)
    return IngestOutcome(stored=len(stored), rejected=[(index, reason) for index, reason, _ in rejected])


def _count_arrivals(server_ids: Sequence[int], *, source: str, now: datetime) -> None:
    """The batch's records in the arrival tally; none when a server was deleted since (its tally
    went with it)."""
    try:
        with transaction.atomic():
            count_received_records(server_ids=server_ids, source=source, now=now)
    except IntegrityError as exc:
        if not isinstance(exc.__cause__, ForeignKeyViolation):
            raise


def _checked(
    facts: Sequence[RequestFacts], *, default_server: str, now: datetime
) -> tuple[list[RequestFacts], list[tuple[int, Rejection, str]]]:
    """The facts that can be stored (their server filled in), and the others: (index, why, server)."""
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


def _outside_retention(arrived_at: datetime, *, oldest: datetime, newest: datetime) -> Rejection | None:
    if arrived_at < oldest:
        days = settings.PREFIXSCOPE_REQUEST_RETENTION_DAYS
        return Rejection(
            RejectReason.TOO_OLD, f"arrived_at: older than the request records' retention ({days} days)"
        )
    if arrived_at >= newest:
        return Rejection(
            RejectReason.TOO_FAR_AHEAD, "arrived_at: further ahead than the request records' partitions"
        )
    return None


def _ingest(
    items: Sequence[RequestFacts],
    *,
    source: str,
    now: datetime,
    malformed: Sequence[Malformed],
    merge: bool,
) -> list[int]:
    """One try at the batch; `merge` sends every record through alignment and merge. Returns the
    server id of each record stored (one per fact: facts merged into one row count each).

    The prompts' block hashes are computed by a thread of their own (_hashed_ahead) while the
    lookups and the transaction's first round trip wait on the database, and the rows are built
    from them as the COPY takes them. Servers, templates and versions, and prefix families, are
    looked up (made when new) before the batch's transaction, each in its own: two batches naming
    the same new templates in their own orders deadlocked on them (a gateway in front of several
    servers runs one writer per server).
    """
    servers = _servers(items, named_by=malformed)
    located = deduplicated([(_known_server(servers, item), item) for item in items])
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
                        unhashed.append(
                            Malformed(source, RejectReason.UNKNOWN_MODEL, UNKNOWN_MODEL_REASON, item.server)
                        )
                    template, version = templates[item.template, item.template_version]
                    family_id, bound = family or (None, None)
                    yield record_row(
                        item, server, chains or ([], []), ids, source=source, token_ids_cutoff=cutoff,
                        template_id=template.pk if template else bound,
                        template_version_id=version.pk if version else None, family_id=family_id,
                    )  # fmt: skip

            keys = [(server.pk, item.request_id, item.arrived_at) for server, item in located]
            store_records(keys, rows(), merge=merge)
            _count_malformed([*malformed, *unhashed], servers, now=now)
    return [_known_server(servers, item).pk for item in items]


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
    tally = Counter((servers.get(m.server), m.source, m.code) for m in malformed)
    details = {(servers.get(m.server), m.source, m.code): m.detail for m in malformed}  # the last one's
    for (server, source, code), count in tally.items():
        count_rejected_input(
            server_id=server.pk if server else None, source=source, code=code,
            detail=details[server, source, code], count=count, now=now,
        )  # fmt: skip


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
    if item.prompt_blocks:  # a hosted prompt: its content blocks' chain (it has no token ids)
        return content_chain(item.prompt_blocks), []
    if ids is None or not len(ids) or not server.block_size:
        return [], []
    try:
        lora = request_lora(server, item.model)
    except UnknownModel:
        return None
    hashes = signed_block_hashes(ids, server.block_size, cache_salt=item.cache_salt, lora=lora)
    neutral = signed_block_hashes(ids, server.block_size, lora=lora) if item.cache_salt else []
    return hashes, neutral


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
