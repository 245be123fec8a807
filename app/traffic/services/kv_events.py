"""The writers of KV events: rows stored once each (COPY), the block index, stream positions, gaps."""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection, transaction

from app.domain.blockhash import wire_to_signed
from app.domain.residency import BlockChange, Change, NetResidency, net_residency
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


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """Where one (server, rank) stream stands after the rows being stored."""

    server_id: int
    dp_rank: int
    epoch: int
    last_seq: int
    last_event_at: datetime


@dataclass(frozen=True, slots=True)
class Gap:
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


def store_kv_events(
    *, rows: Sequence[KVEventRow], positions: Sequence[StreamPosition], gaps: Sequence[Gap] = ()
) -> int:
    """Store KV event rows once each, update the block index and the stream positions, atomically.

    Rows already stored (a redelivery) change nothing, the block index included. Returns the
    number of new rows. Positions only move forward: an older position never overwrites a newer.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        new_rows = _insert_new_kv_rows(cursor, rows)
        _apply_residency(cursor, new_rows)
        _save_positions(cursor, positions)
        _save_gaps(cursor, gaps)
    return len(new_rows)


def _insert_new_kv_rows(cursor: Any, rows: Sequence[KVEventRow]) -> list[KVEventRow]:
    """COPY into a staging table, then insert what is not there yet; returns the new rows in order."""
    cursor.execute(
        "CREATE TEMP TABLE IF NOT EXISTS kv_event_staging (LIKE traffic_kvevent) ON COMMIT DELETE ROWS"
    )
    # Emptied at commit, but a caller's outer transaction may not have committed yet.
    cursor.execute("TRUNCATE kv_event_staging")
    with cursor.cursor.copy(f"COPY kv_event_staging ({_KV_COLUMNS}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(_signed_hashes(row))
    cursor.execute(
        f"INSERT INTO traffic_kvevent ({_KV_COLUMNS}) SELECT {_KV_COLUMNS} FROM kv_event_staging "
        f"ON CONFLICT DO NOTHING RETURNING {_KEY_COLUMNS}"
    )
    inserted = set(cursor.fetchall())
    return [row for row in rows if row[:6] in inserted]


def _signed_hashes(row: KVEventRow) -> KVEventRow:
    def signed(value: int | None) -> int | None:
        return None if value is None else wire_to_signed(value)

    return row._replace(block_hash=signed(row.block_hash), parent_hash=signed(row.parent_hash))


def _apply_residency(cursor: Any, rows: Sequence[KVEventRow]) -> None:
    streams: dict[tuple[int, int], list[KVEventRow]] = {}
    for row in rows:
        streams.setdefault((row.server_id, row.dp_rank), []).append(row)
    for (server_id, dp_rank), stream_rows in streams.items():
        ordered = sorted(stream_rows, key=lambda r: (r.epoch, r.seq, r.event_index, r.block_index))
        net = net_residency(BlockChange(_KIND_CHANGES[r.kind], r.block_hash, r.parent_hash) for r in ordered)
        _write_net_residency(cursor, server_id, dp_rank, net, stored_at=ordered[-1].emitted_at)


_KIND_CHANGES: dict[int, Change] = {
    KVEvent.Kind.STORED: Change.STORED,
    KVEvent.Kind.REMOVED: Change.REMOVED,
    KVEvent.Kind.CLEARED: Change.CLEARED,
}


def _write_net_residency(
    cursor: Any, server_id: int, dp_rank: int, net: NetResidency, stored_at: datetime
) -> None:
    where = "server_id = %s AND dp_rank = %s"
    if net.cleared:
        cursor.execute(f"DELETE FROM traffic_residentblock WHERE {where}", [server_id, dp_rank])
    if net.removed:
        removed = [wire_to_signed(h) for h in net.removed]
        cursor.execute(
            f"DELETE FROM traffic_residentblock WHERE {where} AND block_hash = ANY(%s)",
            [server_id, dp_rank, removed],
        )
    if net.stored:
        hashes = [wire_to_signed(h) for h in net.stored]
        parents = [None if p is None else wire_to_signed(p) for p in net.stored.values()]
        cursor.execute(
            "INSERT INTO traffic_residentblock (server_id, dp_rank, block_hash, parent_hash, stored_at) "
            "SELECT %s, %s, h, p, %s FROM unnest(%s::bigint[], %s::bigint[]) AS u(h, p) "
            "ON CONFLICT (server_id, dp_rank, block_hash) "
            "DO UPDATE SET parent_hash = EXCLUDED.parent_hash, stored_at = EXCLUDED.stored_at",
            [server_id, dp_rank, stored_at, hashes, parents],
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


def _save_gaps(cursor: Any, gaps: Sequence[Gap]) -> None:
    for g in gaps:
        cursor.execute(
            "INSERT INTO traffic_kvgap (server_id, dp_rank, epoch, first_seq, last_seq, recovered, lost, "
            "detected_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [g.server_id, g.dp_rank, g.epoch, g.first_seq, g.last_seq, g.recovered, g.lost, g.detected_at],
        )


def count_rejected_input(
    *, server_id: int | None, source: str, reason: str, count: int, now: datetime
) -> None:
    """Add `count` to the tally of malformed input of this server, source and reason."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO traffic_rejectedinput AS r "
            "(server_id, source, reason, count, first_seen_at, last_seen_at) "
            "VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT ON CONSTRAINT rejected_input_identity DO UPDATE SET "
            "count = r.count + EXCLUDED.count, last_seen_at = EXCLUDED.last_seen_at",
            [server_id, source, reason[:300], count, now, now],
        )
