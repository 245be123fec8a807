"""The arrival tally of request records: how many each source stored per server (RecordsReceived),
exported on /metrics beside the engine's request counter."""

from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from django.db import connection


def count_received_records(*, server_ids: Iterable[int], source: str, now: datetime) -> None:
    """Add one per stored record (one server id each) to its server's tally for `source`, in one
    statement. Its own short transaction, after the batch's: an ingest transaction holding these
    rows' locks would queue every other writer of the same server behind its COPY; a count lost
    to a crash between the two is one batch, never a record."""
    tally = sorted(Counter(server_ids).items())  # one order for all writers: no deadlock between two
    if not tally:
        return
    values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(tally))
    params = [value for server_id, count in tally for value in (server_id, source, count, now, now)]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO traffic_recordsreceived AS r "
            "(server_id, source, count, first_received_at, last_received_at) "
            f"VALUES {values} "
            "ON CONFLICT (server_id, source) DO UPDATE SET "
            "count = r.count + EXCLUDED.count, last_received_at = EXCLUDED.last_received_at",
            params,
        )
