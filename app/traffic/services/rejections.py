"""The tally of rejected input: malformed events, spans and records, and refused batches, counted per
server, source and reason code (shown on the Collection page and in /metrics), never stored; and the
newest few samples of KV events that could not be decoded."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from app.core.retention import kept_token_ids_since
from app.traffic.models import UndecodableSample
from collectors.errors import RejectReason

SAMPLES_KEPT = 3
"""Samples kept per server and reason: enough to compare, too few to be a copy of the stream."""


def count_rejected_input(
    *, server_id: int | None, source: str, code: RejectReason, detail: str, count: int, now: datetime
) -> None:
    """Add `count` to the tally of this server, source and reason code; `detail` (the message of
    the latest rejection) replaces the one kept."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO traffic_rejectedinput AS r "
            "(server_id, source, reason, detail, count, first_seen_at, last_seen_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT ON CONSTRAINT rejected_input_identity DO UPDATE SET "
            "count = r.count + EXCLUDED.count, last_seen_at = EXCLUDED.last_seen_at, "
            "detail = EXCLUDED.detail",
            [server_id, source, RejectReason(code).value, detail[:300], count, now, now],
        )


@dataclass(frozen=True, slots=True)
class Sample:
    """The first bytes of one undecodable KV payload or event."""

    server_id: int
    code: RejectReason
    head: bytes
    seen_at: datetime


def keep_undecodable_samples(samples: Sequence[Sample], *, now: datetime) -> None:
    """Keep the newest SAMPLES_KEPT samples per server and reason, and drop those past the token
    retention: raw bytes can hold token ids, so none are kept where token ids are not (hash-only
    mode, a retention of 0 days)."""
    cutoff = kept_token_ids_since(now)
    if cutoff is None:
        UndecodableSample.objects.all().delete()
        return
    UndecodableSample.objects.bulk_create(
        UndecodableSample(server_id=s.server_id, reason=s.code.value, seen_at=s.seen_at, head=s.head)
        for s in samples[-SAMPLES_KEPT * 8 :]  # a storm of one batch: its last ones say enough
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM traffic_undecodablesample WHERE seen_at < %s OR id IN (SELECT id FROM ("
            "SELECT id, row_number() OVER (PARTITION BY server_id, reason ORDER BY seen_at DESC, id DESC)"
            " AS n"
            " FROM traffic_undecodablesample) ranked WHERE n > %s)",
            [cutoff, SAMPLES_KEPT],
        )
