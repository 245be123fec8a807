"""The writers of traffic data: KV events and the block index, rollups, token-id retention."""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction

from app.domain.blockhash import wire_to_signed
from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.domain.residency import BlockChange, Change, NetResidency, net_residency
from app.fleet.models import Server
from app.fleet.services import record_scrape_outcome
from app.traffic.models import KVEvent, MetricSeries, RequestRecord, Scrape, ScrapeSample
from collectors.metrics.parse import Sample, cache_config, model_name

logger = logging.getLogger(__name__)

_BUCKET_COUNTS = ", ".join(
    f"count(*) FILTER (WHERE r.ttft_seconds <= {bound!r})" for bound in TTFT_BUCKETS_SECONDS
)
# Recomputes whole minutes from raw records, so running it twice (or concurrently with
# late arrivals, then again) converges on the same rows.
_REFRESH_SQL = f"""
INSERT INTO traffic_minuterollup AS m (
    server_id, template_id, minute, requests, prompt_tokens, cached_tokens,
    ttft_count, ttft_sum_seconds, ttft_buckets
)
SELECT r.server_id, r.template_id, date_trunc('minute', r.arrived_at), count(*),
       coalesce(sum(r.prompt_tokens), 0), coalesce(sum(r.cached_tokens), 0),
       count(r.ttft_seconds), coalesce(sum(r.ttft_seconds), 0),
       ARRAY[{_BUCKET_COUNTS}, count(r.ttft_seconds)]
FROM traffic_requestrecord r
WHERE r.arrived_at >= %(since)s AND r.arrived_at < %(until)s
GROUP BY 1, 2, 3
ON CONFLICT ON CONSTRAINT minute_rollup_identity DO UPDATE SET
    requests = EXCLUDED.requests, prompt_tokens = EXCLUDED.prompt_tokens,
    cached_tokens = EXCLUDED.cached_tokens, ttft_count = EXCLUDED.ttft_count,
    ttft_sum_seconds = EXCLUDED.ttft_sum_seconds, ttft_buckets = EXCLUDED.ttft_buckets
"""


def _minute_floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def refresh_minute_rollups(*, since: datetime, until: datetime) -> int:
    """Recompute the rollup rows of every whole minute touching [since, until); returns rows written.

    `since` is rounded down and `until` up to whole minutes, so a minute is never half-counted.
    """
    start = _minute_floor(since)
    end = _minute_floor(until) + (timedelta(minutes=1) if until != _minute_floor(until) else timedelta())
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_REFRESH_SQL, {"since": start, "until": end})
        return int(cursor.rowcount)


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


# --- KV events -------------------------------------------------------------------------


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


# --- /metrics scrapes ------------------------------------------------------------------


def record_scrape(
    *,
    server: Server,
    scraped_at: datetime,
    samples: Sequence[Sample] | None,
    duration_seconds: float,
    error: str = "",
) -> None:
    """Store one pull as scraped: every sample, or the failure (None samples) with its reason.

    A failed pull stores no values: the server shows as down, not as zeros. Storing the same
    pull twice (a redelivered task) writes it once.
    """
    ok = samples is not None
    with transaction.atomic():
        Scrape.objects.bulk_create(
            [Scrape(server=server, scraped_at=scraped_at, ok=ok, error=error[:2000],
                    duration_seconds=duration_seconds, sample_count=len(samples or ()))],
            ignore_conflicts=True,
        )  # fmt: skip
        if samples is not None:
            series = _series_ids(server, samples)
            ScrapeSample.objects.bulk_create(
                [
                    ScrapeSample(
                        server=server,
                        series_id=series[(s.name, s.labels)],
                        scraped_at=scraped_at,
                        value=s.value,
                    )
                    for s in samples
                ],
                ignore_conflicts=True,
            )
            record_scrape_outcome(
                server=server, at=scraped_at, ok=True, config=cache_config(samples), model=model_name(samples)
            )
        else:
            record_scrape_outcome(server=server, at=scraped_at, ok=False)


def _series_ids(
    server: Server, samples: Sequence[Sample]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
    """Ids of the series of these samples, creating the ones this server has not exposed before."""

    def known() -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
        rows = MetricSeries.objects.filter(server=server).values_list("id", "name", "labels")
        return {(name, tuple(sorted(labels.items()))): pk for pk, name, labels in rows}

    ids = known()
    missing = {(s.name, s.labels): s.kind for s in samples if (s.name, s.labels) not in ids}
    if missing:
        MetricSeries.objects.bulk_create(
            [MetricSeries(server=server, name=name, labels=dict(labels), kind=kind)
             for (name, labels), kind in missing.items()],
            ignore_conflicts=True,
        )  # fmt: skip
        ids = known()
    return ids
