"""Upkeep of the database: partitions and retention."""

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from app.core.partitioning import (
    creation_manager,
    expired_partitions,
    forget_partition_ranges,
    partitioned_tables,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionChanges:
    created: list[str]
    dropped: list[str]


def maintain_partitions(*, now: datetime) -> PartitionChanges:
    """Create the partitions due ahead and drop those past retention, in one transaction."""
    created = []
    with transaction.atomic():
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
