"""Daily partitions of the raw tables: created ahead, dropped past their retention.

django-postgres-extra creates the partitions due ahead (`manager`). Dropping is ours: psqlextra
stops at the first missing day, so after a few days without maintenance old partitions, token
ids included, would outlive their retention. We drop by each partition's upper bound instead.
Creation starts a day back, so a fresh install accepts late records of the day before (a record
that arrives at 00:05 about a request at 23:59). Older history inside its retention (a capture
replayed, a sender catching up) gets its day's partition when it arrives (`create_day_partitions`):
partitions are created and dropped under one advisory lock, so the upkeep task and a batch never
race on the same day. Rows past their retention, or too far ahead, have nowhere to go: ingestion
rejects them.
"""

import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cachetools import TTLCache, cached
from django.conf import settings
from django.db import connection, transaction
from psqlextra.backend.schema import PostgresSchemaEditor
from psqlextra.models import PostgresPartitionedModel
from psqlextra.partitioning import (
    PostgresCurrentTimePartitioningStrategy,
    PostgresPartitioningConfig,
    PostgresPartitioningManager,
    PostgresTimePartitionSize,
)
from psqlextra.partitioning.time_partition import PostgresTimePartition

from app.traffic.models import KVEvent, RequestDiagnosis, RequestRecord, Scrape, ScrapeSample

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionedTable:
    model: type[PostgresPartitionedModel]
    retention_days: int


def partitioned_tables() -> list[PartitionedTable]:
    """The partitioned tables with the retention setting of each, read when called."""
    return [
        PartitionedTable(RequestRecord, settings.PREFIXSCOPE_REQUEST_RETENTION_DAYS),
        PartitionedTable(RequestDiagnosis, settings.PREFIXSCOPE_REQUEST_RETENTION_DAYS),
        PartitionedTable(KVEvent, settings.PREFIXSCOPE_KV_EVENT_RETENTION_DAYS),
        PartitionedTable(Scrape, settings.PREFIXSCOPE_SCRAPE_RETENTION_DAYS),
        PartitionedTable(ScrapeSample, settings.PREFIXSCOPE_SCRAPE_RETENTION_DAYS),
    ]


# pg_advisory_xact_lock's key for creating or dropping partitions (maintain_partitions, and
# create_day_partitions for history that arrives late).
PARTITIONS_LOCK = 0x5041_5254
_DAY = PostgresTimePartitionSize(days=1)


def lock_partitions() -> None:
    """Hold the partitions' lock until the transaction ends (creating or dropping partitions)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [PARTITIONS_LOCK])


def day_of(moment: datetime) -> datetime:
    """The start (UTC midnight) of the daily partition that holds `moment`."""
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def create_day_partitions(model: type[PostgresPartitionedModel], days: Iterable[datetime]) -> list[str]:
    """Create the daily partitions of `model` starting at `days` (UTC midnights) that do not exist.

    In a transaction of its own, under the partitions' lock and PREFIXSCOPE_INGEST_LOCK_TIMEOUT_SECONDS
    (creating a partition waits for the batches writing the table): OperationalError when the wait
    is longer. Returns the partitions created; this process forgets the ranges it remembered.
    """
    table = model._meta.db_table
    created = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{settings.PREFIXSCOPE_INGEST_LOCK_TIMEOUT_SECONDS}s'")
        lock_partitions()
        ranges = partition_ranges(table).values()  # read under the lock: what the upkeep made counts
        for day in sorted(set(days)):
            if not any(lower <= day < upper for lower, upper in ranges):
                partition = PostgresTimePartition(size=_DAY, start_datetime=day)
                with connection.schema_editor() as editor:
                    assert isinstance(editor, PostgresSchemaEditor)  # psqlextra's database backend
                    partition.create(model, editor, comment="created for late history")
                created.append(f"{table}_{partition.name()}")
    forget_partition_ranges()
    return created


def ensure_day_partitions(model: type[PostgresPartitionedModel], moments: Sequence[datetime]) -> None:
    """Create the daily partitions rows at `moments` need and do not have (history arriving late).

    The usual batch, all inside the first unbroken span of partitions, is answered from this
    process's memory of their ranges, without a test moment by moment.
    """
    spans = _contiguous_ranges(recent_partition_ranges(model._meta.db_table).values())
    if not moments or (spans and spans[0][0] <= min(moments) and max(moments) < spans[0][1]):
        return
    missing = {day_of(moment) for moment in moments if not any(low <= moment < up for low, up in spans)}
    if missing and (created := create_day_partitions(model, missing)):
        logger.info("partitions created for late rows", extra={"partitions_created": created})


def _contiguous_ranges(ranges: Iterable[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """Partition ranges joined where one ends as the next begins: one range, unless days are missing."""
    joined: list[tuple[datetime, datetime]] = []
    for lower, upper in sorted(ranges):
        if joined and joined[-1][1] == lower:
            joined[-1] = (joined[-1][0], upper)
        else:
            joined.append((lower, upper))
    return joined


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


@dataclass(frozen=True, slots=True)
class PartitionChanges:
    created: list[str]
    dropped: list[str]


def maintain_partitions(*, now: datetime) -> PartitionChanges:
    """Create the partitions due ahead and drop those past retention, in one transaction."""
    created = []
    with transaction.atomic():
        lock_partitions()  # a batch with late history may be creating one of these days' partitions
        plan = creation_manager(now=now).plan(skip_delete=True)
        for model_plan in plan.model_plans:
            table = model_plan.config.model._meta.db_table
            created += [f"{table}_{p.name()}" for p in model_plan.creations]
        plan.apply(using="default")
        dropped = _drop_expired_partitions(now)
    forget_partition_ranges()
    if created or dropped:
        logger.info(
            "partitions changed", extra={"partitions_created": created, "partitions_dropped": dropped}
        )
    return PartitionChanges(created=created, dropped=dropped)


def _drop_expired_partitions(now: datetime) -> list[str]:
    dropped = []
    with connection.cursor() as cursor:
        for table in partitioned_tables():
            db_table = table.model._meta.db_table
            for name in expired_partitions(db_table, now=now, retention_days=table.retention_days):
                cursor.execute(f"DROP TABLE {connection.ops.quote_name(name)}")
                dropped.append(name)
    return dropped
