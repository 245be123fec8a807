"""Daily partitions of the raw tables: created ahead, dropped past their retention.

django-postgres-extra creates the partitions due ahead (`manager`). Dropping is ours: psqlextra
stops at the first missing day, so after a few days without maintenance old partitions, token
ids included, would outlive their retention. We drop by each partition's upper bound instead.
Rows newer than the newest partition have nowhere to go: ingestion rejects them.
"""

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from psqlextra.models import PostgresPartitionedModel
from psqlextra.partitioning import PostgresPartitioningManager, partition_by_current_time

from app.traffic.models import KVEvent, RequestRecord, Scrape, ScrapeSample


@dataclass(frozen=True, slots=True)
class PartitionedTable:
    model: type[PostgresPartitionedModel]
    retention_days: int


def partitioned_tables() -> list[PartitionedTable]:
    """The partitioned tables with the retention setting of each, read when called."""
    return [
        PartitionedTable(RequestRecord, settings.PREFIXSCOPE_REQUEST_RETENTION_DAYS),
        PartitionedTable(KVEvent, settings.PREFIXSCOPE_KV_EVENT_RETENTION_DAYS),
        PartitionedTable(Scrape, settings.PREFIXSCOPE_SCRAPE_RETENTION_DAYS),
        PartitionedTable(ScrapeSample, settings.PREFIXSCOPE_SCRAPE_RETENTION_DAYS),
    ]


def creation_manager() -> PostgresPartitioningManager:
    """Creates today's partition and PREFIXSCOPE_PARTITIONS_AHEAD_DAYS more."""
    ahead = settings.PREFIXSCOPE_PARTITIONS_AHEAD_DAYS
    return PostgresPartitioningManager(
        [partition_by_current_time(t.model, days=1, count=ahead + 1) for t in partitioned_tables()]
    )


_BOUNDS_SQL = """
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid)
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = %s
"""
_BOUNDS = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")


def partition_ranges(table: str) -> dict[str, tuple[datetime, datetime]]:
    """Each partition of `table` with the [from, to) range of times it holds."""
    ranges = {}
    with connection.cursor() as cursor:
        cursor.execute(_BOUNDS_SQL, [table])
        for name, bound in cursor.fetchall():
            if match := _BOUNDS.search(bound):
                ranges[name] = (
                    datetime.fromisoformat(match.group(1)),
                    datetime.fromisoformat(match.group(2)),
                )
    return ranges


def expired_partitions(table: str, *, now: datetime, retention_days: int) -> list[str]:
    """Partitions of `table` whose every row is older than the retention (upper bound <= cutoff)."""
    cutoff = now - timedelta(days=retention_days)
    return sorted(name for name, (_, upper) in partition_ranges(table).items() if upper <= cutoff)
