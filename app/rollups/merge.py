"""Merging a proposed server into the registered server it stands for: its records move (traffic),
and the sums of the minutes they span are summed again, in one transaction."""

from datetime import timedelta

from django.db import transaction

from app.rollups.refresh import refresh_minute_rollups
from app.traffic.services.server_merge import Merged, move_server_records


def merge_server(*, server_id: int, into_id: int) -> Merged:
    """Merge a proposed server into a registered one (move_server_records says how its records
    join), then recompute the request sums of the minutes its records spanned, before either
    server's ingest lock is released: no page reads the merged records under the old sums."""
    with transaction.atomic():
        merged = move_server_records(server_id=server_id, into_id=into_id)
        if merged.span is not None:
            since, until = merged.span
            refresh_minute_rollups(since=since, until=until + timedelta(minutes=1))
    return merged
