"""Daily partitions of the raw tables: created ahead, dropped past their retention.

django-postgres-extra creates the partitions due ahead (`manager`). Dropping is ours: psqlextra
stops at the first missing day, so after a few days without maintenance old partitions, token
ids included, would outlive their retention. We drop by each partition's upper bound instead.
Creation starts a day back, so a fresh install accepts late records of the day before (a record
that arrives at 00:05 about a request at 23:59). Rows newer than the newest partition, or older
than the oldest, have nowhere to go: ingestion rejects them.
"""

import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from cachetools import TTLCache, cached
from django.conf import settings
from django.db import connection
from psqlextra.models import PostgresPartitionedModel
from psqlextra.partitioning import (
    PostgresCurrentTimePartitioningStrategy,
    PostgresPartitioningConfig,
    PostgresPartitioningManager,
    PostgresTimePartitionSize,
)

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


class _DailyFromYesterday(PostgresCurrentTimePartitioningStrategy):
    """psqlextra's daily strategy, counted from the day before `now` instead of the wall clock."""

    def __init__(self, *, now: datetime, ahead_days: int) -> None:
        super().__init__(size=PostgresTimePartitionSize(days=1), count=ahead_days + 2)
        self._start = now - timedelta(days=1)

    def get_start_datetime(self) -> datetime:
        return self._start


def creation_manager(*, now: datetime) -> PostgresPartitioningManager:
    """Creates yesterday's and today's partitions and PREFIXSCOPE_PARTITIONS_AHEAD_DAYS more."""
    ahead = settings.PREFIXSCOPE_PARTITIONS_AHEAD_DAYS
    return PostgresPartitioningManager(
        [
            PostgresPartitioningConfig(t.model, _DailyFromYesterday(now=now, ahead_days=ahead))
            for t in partitioned_tables()
        ]
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


# Ingest tests every batch's arrival times against the partitions, which change once a day: a
# process remembers their ranges for this long (looking them up took a round trip a batch).
# maintain_partitions forgets them in its own process; other processes see a change within these
# seconds, and a batch that meets a partition dropped meanwhile is tried again without the memory.
RANGES_MEMORY_SECONDS = 10


@cached(TTLCache(maxsize=16, ttl=RANGES_MEMORY_SECONDS), lock=threading.Lock())
def recent_partition_ranges(table: str) -> dict[str, tuple[datetime, datetime]]:
    """partition_ranges(table) as this process saw it at most RANGES_MEMORY_SECONDS ago."""
    return partition_ranges(table)


def forget_partition_ranges() -> None:
    recent_partition_ranges.cache_clear()


def expired_partitions(table: str, *, now: datetime, retention_days: int) -> list[str]:
    """Partitions of `table` whose every row is older than the retention (upper bound <= cutoff)."""
    cutoff = now - timedelta(days=retention_days)
    return sorted(name for name, (_, upper) in partition_ranges(table).items() if upper <= cutoff)
