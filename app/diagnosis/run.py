"""The diagnosis of request records: why each one's prompt tokens were not reused, and its funnel.

Each run takes the records not diagnosed yet that arrived in the last PREFIXSCOPE_DIAGNOSIS_LOOKBACK
_MINUTES, up to PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS ago (KV events and spans arrive late: a record is
diagnosed once, after they had time to), and replays in time order the fleet's KV events and the
records from one lookback before the first of them (app/domain/misscauses.py). The process keeps
that replay: its next run reads only the events and records since (the online path), unless a
record came later than that, which replays again from one lookback before it. Events emitted
before the last run and received after it are not replayed (the delay is there to make them rare).
A record is written once (ON CONFLICT DO NOTHING): a redelivered task diagnoses it the same and
stores it once. Runs at once in several workers split the fleet by compatibility group (an advisory
lock each): a request is diagnosed by one of them. Records that arrive later than the lookback are left
undiagnosed. A server whose hit counter is not wired over the lookback (app/diagnosis/counters.py)
has its requests diagnosed as that, not as misses. The minutes of the arrivals diagnosed are then
summed again into traffic.LossMinute, for the dashboards.

Servers are compared within compatibility groups (model, block size, hash algorithm): a block of
one is never "resident elsewhere" on another model's server. A server whose KV events are not
collected (no KV stream) gets `no_kv_events` wherever residency would have to be known.

A prompt is compared with the earlier ones of its template, or, when it has none, of its prefix
family (app/prompts/models.py PrefixFamily): a family is to the diagnosis what a template is.
"""

import logging
import zlib
from collections import Counter
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec
import numpy as np
from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from app.diagnosis.counters import unwired_counters
from app.domain.fleetblocks import EventKind
from app.domain.hosted import HostedHistory, HostedPrompt
from app.domain.misscauses import FleetHistory
from app.domain.misses import Diagnosis, Unknown
from app.domain.requestparts import Parts
from app.domain.requestprompt import RequestPrompt
from app.fleet.models import Server
from app.rollups.refresh import refresh_loss_minutes
from app.traffic.models import KVStream, RequestDiagnosis, span_only_sql
from app.traffic.services.copy_rows import sent_integers
from app.traffic.services.partitions import ensure_day_partitions

logger = logging.getLogger(__name__)

_RECORDS_SQL = """
SELECT r.server_id, r.request_id, r.arrived_at, r.tenant, r.template_id, r.template_version_id,
       r.prompt_tokens, r.cached_tokens, r.salt_hash,
       array_send(r.block_hashes), array_send(r.neutral_hashes), array_send(r.token_ids),
       COALESCE(r.client_ttft_seconds, r.server_ttft_seconds),
       (d.request_id IS NOT NULL) AS diagnosed, {span_only},
       r.provider, r.model, r.cache_write_tokens, r.cache_key_hash, r.cache_breakpoints,
       COALESCE(r.gateway_cache_hit, false), r.part_digests, r.cache_ttl_seconds
FROM traffic_requestrecord r
LEFT JOIN traffic_requestdiagnosis d
  ON d.server_id = r.server_id AND d.request_id = r.request_id AND d.arrived_at = r.arrived_at
WHERE r.arrived_at >= %s AND r.arrived_at < %s AND (%s::int8[] IS NULL OR r.server_id = ANY(%s))
ORDER BY r.arrived_at, r.server_id, r.request_id
""".format(span_only=span_only_sql("r"))
# One row per batch of events (a step of the engine): its events' kinds and blocks' signed hashes
# in order (as the records' chains hold them; the model's UInt64Field would map them to wire values;
# an AllBlocksCleared has no hash: 0 in its place), as array_send's binary arrays. A row per block
# cost the most, its timestamp parsed each time; psycopg's text arrays, a Python step per block.
# One row per tier (medium), KV-cache group and removal reason of a batch: a CPU copy is never a GPU
# block, another group's than the server's attention group is not its prefix's, a request's own
# blocks freed as it ended were not cached (FleetHistory leaves them out: app/domain/tiers.py).
_EVENTS_SQL = """
SELECT emitted_at, server_id, dp_rank, epoch, medium, group_idx, removal_reason,
       array_send(array_agg(kind::int4 ORDER BY event_index, block_index)),
       array_send(array_agg(COALESCE(block_hash, 0) ORDER BY event_index, block_index))
FROM traffic_kvevent
WHERE emitted_at >= %s AND emitted_at < %s AND (%s::int8[] IS NULL OR server_id = ANY(%s))
GROUP BY server_id, dp_rank, epoch, seq, emitted_at, medium, group_idx, removal_reason
ORDER BY emitted_at, server_id, dp_rank, epoch, seq, min(event_index)
"""
_FETCH = 2000


@dataclass(frozen=True, slots=True)
class _Record:
    key: tuple[int, str, datetime]
    template_id: int | None
    template_version_id: int | None
    tenant: str
    prompt: RequestPrompt
    diagnosed: bool
    span_only: bool  # seen in vLLM's span alone: stored as such, out of the loss sums (span_only_sql)
    hosted: HostedPrompt | None = None  # a hosted API's: diagnosed by its provider's rules
    gateway_cache: bool = False  # answered by a gateway's response cache: no prefix reused or missed


@dataclass(slots=True)
class _Replay:
    """A fleet history and the moment up to which events and records were applied to it."""

    history: FleetHistory
    through: datetime
    servers: frozenset[int]  # the fleet it was built for: a server added, merged or removed rebuilds it
    turned_at: datetime  # when its history last began a generation
    hosted: HostedHistory = field(default_factory=HostedHistory)  # the hosted APIs' records

    def turn_when_due(self, *, lookback: timedelta) -> None:
        """A generation every half lookback (so a block is seen before for one to two halves of
        it, as a replay of one lookback would), or once one has seen MEMORY_BLOCKS blocks."""
        full = self.history.generation_blocks > settings.PREFIXSCOPE_DIAGNOSIS_MEMORY_BLOCKS
        if full or self.through - self.turned_at >= lookback / 2:
            self.history.turn()
            self.hosted.turn()
            self.turned_at = self.through


# This process's replays, kept between runs, one per set of groups a run diagnoses (one group per
# task; every group in a run of the whole fleet): a run then reads only what came since the last one
# (the online path). Rebuilt from one lookback of events and records on the first run, after a
# record arrived too late for it (older than `through`), and when runs stopped for a lookback.
_kept: dict[frozenset[Hashable], _Replay] = {}


# pg_try_advisory_lock's first key: one compatibility group's diagnosis ("DIAG"), the second the
# group's hash. Held by a run for its whole length, so two workers never diagnose the same request.
DIAGNOSIS_LOCK_SPACE = 0x4449_4147


def diagnose_requests(*, now: datetime, group: Hashable | None = None) -> int:
    """Diagnose the records due (see the module's docstring); returns how many were stored.

    A run diagnoses the servers of the compatibility groups whose lock it takes (a server is only
    compared within its group), of `group` alone when given (compatibility_groups()): a run at the
    same time in another worker takes the other groups, or none, and leaves their records to the
    next run. Neither diagnoses a request the other does. A group without servers diagnoses nothing.
    """
    servers = {server.pk: server for server in Server.objects.all()}
    groups: dict[int, Hashable] = {pk: _group_of(server) for pk, server in servers.items()}
    wanted = set(groups.values()) if group is None else {group} & set(groups.values())
    with _group_locks(wanted) as held:
        if not held:
            return 0
        mine = {pk: server for pk, server in servers.items() if groups[pk] in held}
        return _diagnose(
            now=now,
            servers=mine,
            groups={pk: groups[pk] for pk in mine},
            all_groups=len(held) == len(set(groups.values())),
        )


def compatibility_groups() -> list[tuple[str, int | None, str]]:
    """The fleet's compatibility groups, in a stable order: what diagnose_requests(group=) takes."""
    return sorted({_group_of(server) for server in Server.objects.all()}, key=repr)


def _group_of(server: Server) -> tuple[str, int | None, str]:
    return (server.model, server.block_size, server.hash_algo)


@contextmanager
def _group_locks(groups: set[Hashable]) -> Iterator[set[Hashable]]:
    """Session advisory locks on the groups no other run holds, released when the block ends (a
    worker that dies has its connection, and so its locks, closed with it)."""
    held: set[Hashable] = set()
    with connection.cursor() as cursor:
        try:
            for group in groups:
                cursor.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", [DIAGNOSIS_LOCK_SPACE, group_lock_key(group)]
                )
                if cursor.fetchone()[0]:
                    held.add(group)
            yield held
        finally:
            for group in held:
                cursor.execute(
                    "SELECT pg_advisory_unlock(%s, %s)", [DIAGNOSIS_LOCK_SPACE, group_lock_key(group)]
                )


def group_lock_key(group: Hashable) -> int:
    """The group's lock key: a stable hash (Python's own is salted per process) that fits int4;
    two groups on one key only take turns."""
    return zlib.crc32(repr(group).encode()) - 2**31


def _diagnose(
    *, now: datetime, servers: dict[int, Server], groups: dict[int, Hashable], all_groups: bool
) -> int:
    key = frozenset(groups.values())
    until = now - timedelta(seconds=settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS)
    lookback = timedelta(minutes=settings.PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES)
    streaming = set(KVStream.objects.values_list("server_id", flat=True))
    fleet = frozenset(servers)
    only = None if all_groups else sorted(fleet)  # None: no filter (the usual run, with every group)
    replay = _kept.get(key)
    if replay is not None and replay.through >= until - lookback and replay.servers == fleet:
        late = _first_undiagnosed(since=until - lookback, until=replay.through, only=only)
        if late is not None:  # diagnosed against the fleet as it was: replay from before it
            replay = _Replay(FleetHistory(groups), late - lookback, fleet, turned_at=late - lookback)
        elif until <= replay.through:
            return 0  # nothing new (a clock behind the last run's): events are never applied twice
    else:
        due = _first_undiagnosed(since=until - lookback, until=until, only=only)
        if due is None:
            return 0
        replay = _Replay(FleetHistory(groups), due - lookback, fleet, turned_at=due - lookback)
    replay.history.regroup(groups, {pk: server.attention_group for pk, server in servers.items()})
    _kept.pop(key, None)  # until this run is stored: a failed run starts over
    found = _advance(replay, until=until, servers=servers, streaming=streaming, only=only)
    # Events after a request's arrival may have revised it (a block evicted while it waited).
    history = replay.history
    unwired = unwired_counters(since=until - lookback, until=until, only=only) if found else set()
    stored = _store([_stored(r, history.revised.get(r.key, diagnosis), now=now, unwired=unwired)
                     for r, diagnosis in found])  # fmt: skip
    history.forget_settled(until)
    replay.turn_when_due(lookback=lookback)
    for other in [other for other in _kept if other & key]:  # a group is kept in one replay, the latest
        del _kept[other]
    _kept[key] = replay
    return stored


def forget_kept_replay() -> None:
    """Drop this process's replays: the next run rebuilds them from the database."""
    _kept.clear()


def _advance(
    replay: _Replay,
    *,
    until: datetime,
    servers: dict[int, Server],
    streaming: set[int],
    only: list[int] | None,
) -> list[tuple[_Record, Diagnosis | Unknown]]:
    """Apply the events and records of [replay.through, until) in time order; the records not
    diagnosed yet are diagnosed, the others only remembered."""
    history = replay.history
    events = _events(since=replay.through, until=until, only=only)
    pending = next(events, None)
    found: list[tuple[_Record, Diagnosis | Unknown]] = []
    for record in _records(
        since=replay.through, until=until, servers=servers, streaming=streaming, only=only
    ):
        while pending is not None and pending[0] <= record.prompt.arrived_at:
            _apply(history, pending)
            pending = next(events, None)
        if record.gateway_cache:
            if not record.diagnosed:  # the model never saw it: nothing to remember or diagnose
                found.append((record, Unknown.NO_PROMPT))
        elif record.hosted is not None:
            if record.diagnosed:
                replay.hosted.remember(record.hosted)
            else:
                found.append((record, replay.hosted.diagnose(record.hosted)))
        elif record.diagnosed:
            history.remember(record.prompt)
        else:
            found.append((record, history.diagnose(record.prompt)))
    while pending is not None:  # the rest, for the requests still waiting for their first token
        _apply(history, pending)
        pending = next(events, None)
    replay.through = until
    return found


def _first_undiagnosed(*, since: datetime, until: datetime, only: list[int] | None) -> datetime | None:
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT min(r.arrived_at) FROM traffic_requestrecord r
            WHERE r.arrived_at >= %s AND r.arrived_at < %s AND (%s::int8[] IS NULL OR r.server_id = ANY(%s))
              AND NOT EXISTS (SELECT FROM traffic_requestdiagnosis d WHERE d.server_id = r.server_id
                AND d.request_id = r.request_id AND d.arrived_at = r.arrived_at)""",
            [since, until, only, only],
        )
        (first,) = cursor.fetchone()
    return first  # type: ignore[no-any-return]


# at, server, rank, epoch, medium, KV-cache group, removal reason, kinds, hashes (array_send)
_Batch = tuple[datetime, int, int, int, str, int | None, int | None, bytes, bytes]


def _events(*, since: datetime, until: datetime, only: list[int] | None) -> Iterator[_Batch]:
    with connection.chunked_cursor() as cursor:
        cursor.execute(_EVENTS_SQL, [since, until, only, only])
        while rows := cursor.fetchmany(_FETCH):
            yield from rows


def _apply(history: FleetHistory, batch: _Batch) -> None:
    """A batch's blocks, each run of one kind at once."""
    at, server, rank, epoch, medium, group, reason, sent_kinds, sent_hashes = batch
    kinds, hashes = sent_integers(sent_kinds), sent_integers(sent_hashes)
    assert kinds is not None and hashes is not None  # array_agg of a group's rows: never NULL
    starts = [0, *(np.flatnonzero(kinds[1:] != kinds[:-1]) + 1).tolist()]
    for start, end in zip(starts, [*starts[1:], len(kinds)], strict=True):
        kind = EventKind(int(kinds[start]))
        run = [] if kind == EventKind.CLEARED else hashes[start:end].tolist()
        history.apply_blocks(server, rank, epoch, at, kind, run, medium=medium, group=group, reason=reason)


def _records(
    *,
    since: datetime,
    until: datetime,
    servers: dict[int, Server],
    streaming: set[int],
    only: list[int] | None,
) -> Iterator[_Record]:
    # A named cursor: the window's records stream from the server, not all in memory at once.
    with connection.chunked_cursor() as cursor:
        cursor.execute(_RECORDS_SQL, [since, until, only, only])
        while rows := cursor.fetchmany(_FETCH):
            for row in rows:
                yield _record(row, servers[row[0]], kv_events=row[0] in streaming)


def _record(row: tuple[Any, ...], server: Server, *, kv_events: bool) -> _Record:
    (server_id, request_id, arrived_at, tenant, template_id, version_id,
     prompt_tokens, cached_tokens, salt_hash, block_hashes, neutral, token_ids, ttft,
     diagnosed, span_only, provider, model, written, cache_key, breakpoints, gateway_cache,
     part_digests, ttl) = row  # fmt: skip
    hit = server.hit_block
    prompt = RequestPrompt(
        server=server_id, arrived_at=arrived_at, block_size=server.block_size, prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens, block_hashes=_hashes(block_hashes), salt=salt_hash,
        # Compared with its template's earlier prompts, else with all earlier prompts without one
        # (None). Not with its prefix family: that is its first blocks, and a timestamp there, the
        # change that matters most, would make each prompt a family of its own, so cold.
        neutral_hashes=_hashes(neutral), family=template_id,
        token_ids=sent_integers(token_ids), kv_events=kv_events,
        first_token_at=arrived_at + timedelta(seconds=ttft) if ttft is not None else None,
        key=(server_id, request_id, arrived_at),
        effective_block=hit.effective if hit else None, drops_last_block=bool(hit and hit.drops_last),
        parts=_parts(part_digests, model, server),
    )  # fmt: skip
    key = (server_id, request_id, arrived_at)
    hosted = None
    if provider:
        hosted = HostedPrompt(
            provider=provider, model=model, arrived_at=arrived_at, prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens, cache_write_tokens=written, cache_ttl_seconds=ttl,
            chain=prompt.block_hashes, breakpoints=breakpoints, cache_key=cache_key, tenant=tenant,
            parts=prompt.parts, key=key, family=template_id,
        )  # fmt: skip
    return _Record(key, template_id, version_id, tenant, prompt, diagnosed, span_only, hosted, gateway_cache)


def _parts(stored: str | None, model: str, server: Server) -> Parts | None:
    """The record's part digests (jsonb, which Django's connection reads as text) with its model
    as its server resolves it: an adapter by its name, the base model (named or not) as the
    server's model."""
    if stored is None:
        return None
    adapter = model in server.lora_adapters
    model = model if adapter else server.model or model
    return Parts.from_json(msgspec.json.decode(stored), model=model, adapter=adapter)


def _hashes(sent: bytes | None) -> list[int]:
    """A chain as a list: its hashes are dictionary keys, one by one (token ids stay an array)."""
    found = sent_integers(sent)
    return found.tolist() if found is not None else []


def _stored(
    record: _Record, found: Diagnosis | Unknown, *, now: datetime, unwired: set[int]
) -> dict[str, Any]:
    """The RequestDiagnosis row, by column (a model instance per row cost more than its diagnosis).
    A request of a server whose hit counter is not wired (`unwired`) is that, not a miss."""
    server_id, request_id, arrived_at = record.key
    row = _DEFAULTS | {
        "server_id": server_id, "request_id": request_id, "arrived_at": arrived_at, "diagnosed_at": now,
        "template_id": record.template_id, "template_version_id": record.template_version_id,
        "tenant": record.tenant, "prompt_tokens": record.prompt.prompt_tokens or 0, "losses": [],
    }  # fmt: skip
    if record.span_only:
        row["unknown"] = RequestDiagnosis.Unknown.SPAN_ONLY.value
        return row
    if record.gateway_cache:
        row["unknown"] = RequestDiagnosis.Unknown.GATEWAY_CACHE.value
        return row
    if isinstance(found, Unknown):
        row["unknown"] = found.value
        return row
    if record.prompt.server in unwired:
        row["unknown"] = RequestDiagnosis.Unknown.COUNTER_NOT_WIRED.value
        return row
    funnel = found.funnel
    row |= {
        "cause": found.cause.value if found.cause else "", "diverged_at": found.diverged_at,
        "unexpected_hit": found.unexpected_hit, "seen_before_tokens": funnel.seen_before,
        "resident_anywhere_tokens": funnel.resident_anywhere, "resident_here_tokens": funnel.resident_here,
        "reused_tokens": funnel.reused, "losses": [loss.to_json() for loss in found.losses],
        "changed_part": found.changed_part.value if found.changed_part else "",
        "part_detail": found.part_detail,
        "compared_with": _request_id_of(found.compared_with),
    }  # fmt: skip
    for cause, tokens in found.tokens_by_cause().items():
        row[f"{cause.value}_tokens"] = tokens
    return row


def _request_id_of(key: Hashable) -> str:
    """The request id of a record's key (server, request id, arrival); "" for none."""
    return str(key[1]) if isinstance(key, tuple) else ""


def _store(rows: list[dict[str, Any]]) -> int:
    """Insert the diagnoses not stored yet (COPY to a staging table, then ON CONFLICT DO NOTHING:
    a bulk INSERT's statement text cost more than the diagnoses), then their minutes' sums."""
    if not rows:
        return 0
    arrivals = [row["arrived_at"] for row in rows]
    ensure_day_partitions(RequestDiagnosis, arrivals)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS diagnosis_staging (LIKE traffic_requestdiagnosis) "
            "ON COMMIT DELETE ROWS"
        )
        cursor.execute("TRUNCATE diagnosis_staging")  # a caller's outer transaction may still hold rows
        with connection.wrap_database_errors, cursor.cursor.copy(_COPY_SQL) as copy:
            for row in rows:
                row["losses"] = Jsonb(row["losses"])
                copy.write_row([row[name] for name in _FIELDS])
        cursor.execute(_INSERT_SQL)
    refresh_loss_minutes(since=min(arrivals), until=max(arrivals) + timedelta(microseconds=1))
    counts = Counter(row["cause"] or row["unknown"] or "reused" for row in rows)
    logger.info("requests diagnosed", extra={"diagnosed": len(rows), "by_cause": counts})
    return len(rows)


_FIELDS = [field.attname for field in RequestDiagnosis._meta.concrete_fields if field.column]
_DEFAULTS = {
    field.attname: field.get_default() for field in RequestDiagnosis._meta.concrete_fields if field.column
}
_COLUMNS = ", ".join(_FIELDS)
_COPY_SQL = f"COPY diagnosis_staging ({_COLUMNS}) FROM STDIN"
_INSERT_SQL = (
    f"INSERT INTO traffic_requestdiagnosis ({_COLUMNS}) SELECT {_COLUMNS} FROM diagnosis_staging "
    "ON CONFLICT DO NOTHING"
)
