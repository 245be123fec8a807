"""The schema stays shardable by server for Citus (DESIGN.md, Scale), read from PostgreSQL's catalogue.

Citus distributes a table by one column and wants, of every distributed table: the distribution
column in its primary key and in each unique index (a uniqueness one node cannot check alone is
refused), and no foreign key to another distributed table that does not go through that column.
The large tables are the day-partitioned raw tables (every partitioned table in the catalogue) and
those that grow with them: the rollups, and the block index (a row per resident block per server).
The small ones (servers, templates, tokens...) become Citus reference tables, copied to every node:
a foreign key to one of them is fine. A few sums are across servers by design (a template's hours
over the fleet, a prefix shared by tenants on any server): keyed by what they sum to, they become
reference tables too, filled by INSERT ... SELECT from the distributed rollups; their rows grow with
templates, tenants and shared prefixes, not with servers or requests. Every table of the
traffic app is one of the three, named here, so a new one is placed before it ships.
"""

import pytest
from django.apps import apps
from django.db import connection

from app.rollups.catalog import ROLLUPS
from app.traffic.models import (
    CollectorProcess,
    HourRollup,
    KVGap,
    KVStream,
    LossHour,
    LossMinute,
    MetricSeries,
    MinuteRollup,
    RecordsReceived,
    RejectedInput,
    ResidentBlock,
    ServerHour,
    ServerLossHour,
    ServerLossMinute,
    ServerLossQuarter,
    ServerMinute,
    ServerRequestHour,
    ServerRequestMinute,
    TenantSalt,
    UndecodableSample,
)

pytestmark = pytest.mark.django_db

DISTRIBUTION_COLUMN = "server_id"
GROWING_WITH_TRAFFIC = [
    MinuteRollup,
    HourRollup,
    LossMinute,
    LossHour,
    ServerMinute,
    ServerHour,
    ServerRequestHour,
    ServerLossHour,
    ServerLossQuarter,
    ServerRequestMinute,
    ServerLossMinute,
    ResidentBlock,
]

# Reference tables: a row per server, stream, series or collector process, a tally per reason or
# source, or the few samples kept per server and reason.
SMALL = [KVStream, KVGap, CollectorProcess, RejectedInput, MetricSeries, RecordsReceived, UndecodableSample]
# The sum tables keyed by no server (the catalog says which), and TenantSalt: a row per tenant and salt
# it sent, whatever the servers.
SUMS_ACROSS_SERVERS = [rollup.model for rollup in ROLLUPS if "server_id" not in rollup.keys] + [TenantSalt]


_PARTITIONED_SQL = """
SELECT c.relname FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema()
"""
# Each unique index of a table (the primary key's among them) with its columns.
_UNIQUE_SQL = """
SELECT i.indexrelid::regclass::text, i.indisprimary,
       array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attname IS NOT NULL)
FROM pg_index i
LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s::regclass AND i.indisunique
GROUP BY 1, 2
"""
_FOREIGN_KEYS_SQL = """
SELECT conname, conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint
WHERE contype = 'f' AND conrelid = ANY(%s::regclass[]) AND confrelid = ANY(%s::regclass[])
"""


def large_tables() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(_PARTITIONED_SQL)
        partitioned = [name for (name,) in cursor.fetchall()]
    return sorted({*partitioned, *(model._meta.db_table for model in GROWING_WITH_TRAFFIC)})


def unique_indexes_without_server(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(_UNIQUE_SQL, [table])
        return sorted(
            f"{'primary key' if primary else 'unique index'} ({', '.join(columns or ['an expression'])})"
            for name, primary, columns in cursor.fetchall()
            if DISTRIBUTION_COLUMN not in (columns or [])
        )


def test_the_large_tables_are_the_raw_partitioned_ones_and_what_grows_with_them() -> None:
    assert {"traffic_kvevent", "traffic_requestrecord", "traffic_requestdiagnosis", "traffic_scrape",
            "traffic_scrapesample"} <= set(large_tables())  # fmt: skip


def test_every_large_table_has_the_server_in_its_primary_key_and_each_unique_index() -> None:
    found = {table: unique_indexes_without_server(table) for table in large_tables()}
    assert {table: problems for table, problems in found.items() if problems} == {}


def test_no_foreign_key_joins_two_large_tables() -> None:
    tables = large_tables()
    with connection.cursor() as cursor:
        cursor.execute(_FOREIGN_KEYS_SQL, [tables, tables])
        assert cursor.fetchall() == []


def test_every_traffic_table_is_large_small_or_a_sum_across_servers() -> None:
    named = {model._meta.db_table for model in SMALL + SUMS_ACROSS_SERVERS} | set(large_tables())
    traffic = {model._meta.db_table for model in apps.get_app_config("traffic").get_models()}
    assert traffic - named == set()
