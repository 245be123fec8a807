"""The tally of rejected input: malformed events, spans and records, and refused batches, counted per
server, source and reason (shown on the Collection page and in /metrics), never stored."""

from datetime import datetime

from django.db import connection


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
