"""The writers of KV events: rows stored once each (COPY), the block index, stream positions, gaps."""

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple

from django.db import DataError, IntegrityError, connection, transaction
from psycopg.errors import UniqueViolation

from app.domain.blockhash import wire_to_signed
from app.domain.residency import Change, NetResidency, net_residency_of_columns, net_residency_of_epoch
from app.domain.tiers import FALLBACK_ATTENTION_GROUP, is_residency, takes_cached_blocks
from app.traffic.models import KVEvent

logger = logging.getLogger(__name__)


class KVEventRow(NamedTuple):
    """One block of one KV event, in the column order of traffic_kvevent (hashes unsigned)."""

    server_id: int
    dp_rank: int
    epoch: int
    seq: int
    event_index: int
    block_index: int
    emitted_at: datetime
    received_at: datetime
    kind: int
    block_hash: int | None
    parent_hash: int | None
    token_count: int | None
    medium: str
    lora_name: str
    group_idx: int | None
    removal_reason: int | None = None  # BlockRemoved: app/domain/tiers.py RemovalReason; None: not said


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """Where one (server, rank) stream stands after the rows being stored."""

    server_id: int
    dp_rank: int
    epoch: int
    last_seq: int
    last_event_at: datetime


@dataclass(frozen=True, slots=True)
class GapRecord:
    """Batches of one stream the subscriber missed, as stored (KVGap): how many replay recovered."""

    server_id: int
    dp_rank: int
    epoch: int
    first_seq: int
    last_seq: int
    recovered: int
    lost: int
    detected_at: datetime


_KV_COLUMNS = ", ".join(KVEventRow._fields)
_KEY_COLUMNS = "server_id, dp_rank, epoch, seq, event_index, block_index"


@dataclass(frozen=True, slots=True)
class StreamCounts:
    """Blocks one stream stored, removed and stored again soon after removal, since the last flush."""

    server_id: int
    dp_rank: int
    stored: int
    removed: int
    thrashed: int


def store_kv_events(
    *,
    rows: Sequence[KVEventRow],
    positions: Sequence[StreamPosition],
    gaps: Sequence[GapRecord] = (),
    counts: Sequence[StreamCounts] = (),
    attention: Mapping[int, int] | None = None,
) -> int:
    """Store KV event rows once each, update the block index and the stream positions, atomically.

    Rows already stored (a redelivery) change nothing, the block index included. Returns the
    number of new rows. Positions only move forward: an older position never overwrites a newer.
    A stream's block index holds the blocks of its committed epoch: reaching a newer epoch (the
    server restarted) empties it first, in the same transaction. `attention`: server id -> the
    KV-cache group its block index follows (Server.attention_group; servers not listed: 0).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        new_rows = _insert_new_kv_rows(cursor, rows)
        resident = _apply_residency(cursor, new_rows, positions, attention or {})
        _save_positions(cursor, positions)
        _add_resident(cursor, resident)
        _save_gaps(cursor, gaps)
        _add_counts(cursor, counts)
    return len(new_rows)


def _insert_new_kv_rows(cursor: Any, rows: Sequence[KVEventRow]) -> Sequence[KVEventRow]:
    """Insert the rows not stored yet; returns them in order.

    Usually none is stored yet, and one COPY straight into the table does it. When a row is there
    already (a redelivery) that COPY fails on the primary key and is rolled back to its savepoint,
    and the rows go through a staging table and INSERT ... ON CONFLICT DO NOTHING instead.
    """
    if not rows:
        return []
    _check_ranges(rows)
    try:
        with transaction.atomic():  # a savepoint: the failed COPY leaves the transaction usable
            _copy_rows(cursor, "traffic_kvevent", rows)
    except IntegrityError as exc:
        if not isinstance(exc.__cause__, UniqueViolation):
            raise  # e.g. no partition for the rows' time: refused as before
    else:
        return rows
    return _insert_new_via_staging(cursor, rows)


def _insert_new_via_staging(cursor: Any, rows: Sequence[KVEventRow]) -> list[KVEventRow]:
    """COPY into a staging table, then insert what is not there yet; returns the new rows in order."""
    cursor.execute(
        "CREATE TEMP TABLE IF NOT EXISTS kv_event_staging (LIKE traffic_kvevent) ON COMMIT DELETE ROWS"
    )
    # Emptied at commit, but a caller's outer transaction may not have committed yet.
    cursor.execute("TRUNCATE kv_event_staging")
    _copy_rows(cursor, "kv_event_staging", rows)
    cursor.execute(
        f"INSERT INTO traffic_kvevent ({_KV_COLUMNS}) SELECT {_KV_COLUMNS} FROM kv_event_staging "
        f"ON CONFLICT DO NOTHING RETURNING {_KEY_COLUMNS}"
    )
    inserted = set(cursor.fetchall())
    return [row for row in rows if row[:6] in inserted]


# The type of each of traffic_kvevent's columns, for binary COPY, and the range of its integers
# (binary COPY would wrap one out of range silently); columns by position, named once here.
_COLUMN_TYPES = {
    "server_id": "int8", "dp_rank": "int2", "epoch": "int4", "seq": "int8", "event_index": "int2",
    "block_index": "int4", "emitted_at": "timestamptz", "received_at": "timestamptz", "kind": "int2",
    "block_hash": "int8", "parent_hash": "int8", "token_count": "int2", "medium": "text",
    "lora_name": "text", "group_idx": "int2", "removal_reason": "int2",
}  # fmt: skip
_COPY_TYPES = [_COLUMN_TYPES[column] for column in KVEventRow._fields]
_INT2, _INT4, _INT8 = (-(2**15), 2**15 - 1), (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)
_RANGES = {"int2": _INT2, "int4": _INT4}
_INTEGER_RANGES = {
    index: _RANGES.get(kind, _INT8)
    for index, kind in enumerate(_COPY_TYPES)
    if kind.startswith("int") and KVEventRow._fields[index] not in ("server_id", "block_hash", "parent_hash")
}  # hashes are uint64 on the wire, stored as signed: wire_to_signed, below
_SIGNED_LIMIT = 2**63  # hashes below it are stored as they are
_BLOCK_HASH = KVEventRow._fields.index("block_hash")  # then parent_hash
_KEY = itemgetter(*range(KVEventRow._fields.index("emitted_at")))  # stream, epoch, seq, event, block


def _check_ranges(rows: Sequence[KVEventRow]) -> None:
    """Raise DataError when an integer does not fit its column: binary COPY would wrap it silently.

    Column by column over distinct values (a batch repeats most of them), so it costs little.
    """
    for index, (lowest, highest) in _INTEGER_RANGES.items():
        values = set(map(itemgetter(index), rows))
        values.discard(None)
        if values and not lowest <= min(values) <= max(values) <= highest:
            raise DataError(f"a KV event row's {KVEventRow._fields[index]} is out of its column's range")


def _copy_rows(cursor: Any, table: str, rows: Sequence[KVEventRow]) -> None:
    """COPY rows in binary format, hashes mapped onto bigint; errors raised as Django's (DataError, ...).

    Binary skips the server's text parsing and psycopg's text formatting of every datetime. Its
    datetimes must be aware (they always are with USE_TZ); _check_ranges must have passed.
    """
    with (
        connection.wrap_database_errors,
        cursor.cursor.copy(f"COPY {table} ({_KV_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types(_COPY_TYPES)
        write = copy.write_row
        for row in rows:
            block_hash, parent_hash = row.block_hash, row.parent_hash
            # wire_to_signed inline: a call per hash would cost as much as the rest of the row.
            if block_hash is not None and not 0 <= block_hash < _SIGNED_LIMIT:
                block_hash = wire_to_signed(block_hash)
            if parent_hash is not None and not 0 <= parent_hash < _SIGNED_LIMIT:
                parent_hash = wire_to_signed(parent_hash)
            write((*row[:_BLOCK_HASH], block_hash, parent_hash, *row[_BLOCK_HASH + 2 :]))


def _apply_residency(
    cursor: Any, rows: Sequence[KVEventRow], positions: Sequence[StreamPosition], attention: Mapping[int, int]
) -> dict[tuple[int, int], int]:
    """Apply each (server, rank) stream's net change to the block index, rows taken in stream order;
    returns each stream's change in its number of resident blocks (rows inserted minus rows deleted).

    Only the newest epoch a stream reaches here counts, whether by rows or by position alone (a
    restarted server's first batch may bring no row); net_residency_of_epoch says what it does.
    """
    ordered = sorted(rows, key=_KEY)
    streams = {key: list(group) for key, group in groupby(ordered, key=itemgetter(0, 1))}
    newest = {key: stream[-1].epoch for key, stream in streams.items()}
    for p in positions:
        key = (p.server_id, p.dp_rank)
        newest[key] = max(newest.get(key, p.epoch), p.epoch)
    resident_epochs = _committed_epochs(cursor, {server_id for server_id, _ in newest})
    changed: dict[tuple[int, int], int] = {}
    for (server_id, dp_rank), epoch in newest.items():
        stream = streams.get((server_id, dp_rank), [])
        if stream and stream[0].epoch != epoch:  # restarted within these rows: the old process is gone
            stream = [row for row in stream if row.epoch == epoch]
        stream = _gpu_attention_rows(stream, attention.get(server_id, FALLBACK_ATTENTION_GROUP))
        net = net_residency_of_columns(
            list(map(_KIND_CHANGES.__getitem__, map(itemgetter(8), stream))),
            list(map(itemgetter(9), stream)),
            list(map(itemgetter(10), stream)),
        )
        net = net_residency_of_epoch(
            net, epoch=epoch, resident_epoch=resident_epochs.get((server_id, dp_rank))
        )
        stored_at = stream[-1].emitted_at if stream else None
        changed[(server_id, dp_rank)] = _write_net_residency(
            cursor, server_id, dp_rank, net, stored_at=stored_at
        )
    return changed


def _gpu_attention_rows(stream: list[KVEventRow], attention: int) -> list[KVEventRow]:
    """The rows that move the block index: the GPU tier of the server's attention group. A lower
    tier's copy (medium CPU, ...) or another KV-cache group's block of the same hash is not a
    resident prefix block, and its removal does not take one away; nor does the removal of a
    request's own blocks as it ended (released, aborted: app/domain/tiers.py)."""
    kinds = set(map(_TIER_OF, stream))  # almost always one: checked at C speed, filtered if not
    if all(_moves_index(medium, group, reason, attention) for medium, group, reason in kinds):
        return stream
    return [r for r in stream if _moves_index(r.medium, r.group_idx, r.removal_reason, attention)]


def _moves_index(medium: str, group: int | None, reason: int | None, attention: int) -> bool:
    return is_residency(medium, group, attention) and takes_cached_blocks(reason)


_TIER_OF = itemgetter(*map(KVEventRow._fields.index, ("medium", "group_idx", "removal_reason")))


def _committed_epochs(cursor: Any, server_ids: set[int]) -> dict[tuple[int, int], int]:
    """The epoch of each (server, rank) stream's committed position, for these servers' streams."""
    if not server_ids:
        return {}
    cursor.execute(
        "SELECT server_id, dp_rank, epoch FROM traffic_kvstream WHERE server_id = ANY(%s)", [list(server_ids)]
    )
    return {(server_id, dp_rank): epoch for server_id, dp_rank, epoch in cursor.fetchall()}


_KIND_CHANGES: dict[int, Change] = {
    KVEvent.Kind.STORED: Change.STORED,
    KVEvent.Kind.REMOVED: Change.REMOVED,
    KVEvent.Kind.CLEARED: Change.CLEARED,
}


def _write_net_residency(
    cursor: Any, server_id: int, dp_rank: int, net: NetResidency, stored_at: datetime | None
) -> int:
    """Write one stream's net change to the block index; returns its rows inserted minus deleted
    (counted from what the statements did, so a redelivered change counts nothing)."""
    where = "server_id = %s AND dp_rank = %s"
    change = 0
    if net.cleared:
        cursor.execute(f"DELETE FROM traffic_residentblock WHERE {where}", [server_id, dp_rank])
        change -= cursor.rowcount
    if net.removed:
        removed = [wire_to_signed(h) for h in net.removed]
        cursor.execute(
            f"DELETE FROM traffic_residentblock WHERE {where} AND block_hash = ANY(%s)",
            [server_id, dp_rank, removed],
        )
        change -= cursor.rowcount
    if net.stored:
        hashes = [wire_to_signed(h) for h in net.stored]
        parents = [None if p is None else wire_to_signed(p) for p in net.stored.values()]
        # xmax is 0 on a row this statement inserted, not on one it updated (a block stored again).
        cursor.execute(
            "WITH written AS ("
            "INSERT INTO traffic_residentblock (server_id, dp_rank, block_hash, parent_hash, stored_at) "
            "SELECT %s, %s, h, p, %s FROM unnest(%s::bigint[], %s::bigint[]) AS u(h, p) "
            "ON CONFLICT (server_id, dp_rank, block_hash) "
            "DO UPDATE SET parent_hash = EXCLUDED.parent_hash, stored_at = EXCLUDED.stored_at "
            "RETURNING xmax = 0 AS inserted) "
            "SELECT count(*) FILTER (WHERE inserted) FROM written",
            [server_id, dp_rank, stored_at, hashes, parents],
        )
        change += cursor.fetchone()[0]
    return change


def _add_resident(cursor: Any, changed: dict[tuple[int, int], int]) -> None:
    """Move each stream's count of resident blocks by its change (its row exists: positions are
    saved first, and every stream with rows has a position)."""
    for (server_id, dp_rank), change in changed.items():
        if change:
            cursor.execute(
                "UPDATE traffic_kvstream SET resident_blocks = resident_blocks + %s "
                "WHERE server_id = %s AND dp_rank = %s",
                [change, server_id, dp_rank],
            )


def _save_positions(cursor: Any, positions: Sequence[StreamPosition]) -> None:
    for p in positions:
        cursor.execute(
            "INSERT INTO traffic_kvstream AS s (server_id, dp_rank, epoch, last_seq, last_event_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (server_id, dp_rank) DO UPDATE SET "
            "epoch = EXCLUDED.epoch, last_seq = EXCLUDED.last_seq, last_event_at = EXCLUDED.last_event_at "
            "WHERE (EXCLUDED.epoch, EXCLUDED.last_seq) > (s.epoch, s.last_seq)",
            [p.server_id, p.dp_rank, p.epoch, p.last_seq, p.last_event_at],
        )


def _add_counts(cursor: Any, counts: Sequence[StreamCounts]) -> None:
    """Add to the streams' running totals (their rows exist: positions are saved first)."""
    for c in counts:
        cursor.execute(
            "UPDATE traffic_kvstream SET blocks_stored = blocks_stored + %s, "
            "blocks_removed = blocks_removed + %s, blocks_thrashed = blocks_thrashed + %s "
            "WHERE server_id = %s AND dp_rank = %s",
            [c.stored, c.removed, c.thrashed, c.server_id, c.dp_rank],
        )


def _save_gaps(cursor: Any, gaps: Sequence[GapRecord]) -> None:
    for g in gaps:
        cursor.execute(
            "INSERT INTO traffic_kvgap (server_id, dp_rank, epoch, first_seq, last_seq, recovered, lost, "
            "detected_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [g.server_id, g.dp_rank, g.epoch, g.first_seq, g.last_seq, g.recovered, g.lost, g.detected_at],
        )
