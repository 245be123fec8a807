"""Second PostgreSQL sessions on the test database, for tests that make ingest wait on a lock."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection


def session() -> psycopg.Connection[Any]:
    """A connection of its own to the database Django's connection uses (the test database)."""
    params = connection.settings_dict
    return psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"],
        password=params["PASSWORD"] or None,
        host=params["HOST"] or None,
        port=params["PORT"] or None,
    )


@contextmanager
def inserts_blocked() -> Iterator[psycopg.Connection[Any]]:
    """A session holding SHARE on traffic_requestrecord until it rolls back (or the block ends)."""
    with session() as other:
        other.execute("LOCK TABLE traffic_requestrecord IN SHARE MODE")
        yield other


def wait_for_a_blocked_insert() -> None:
    """Return once an INSERT or COPY into traffic_requestrecord waits for a lock in this database."""
    wait_for_lock_waits(1, query="(INSERT INTO|COPY) traffic_requestrecord ")


def wait_for_lock_waits(count: int, *, query: str = "") -> None:
    """Return once `count` sessions of this database wait for a lock (with `query`, a regular
    expression, only those whose statement matches it)."""
    with session() as watcher:
        watcher.autocommit = True
        for _ in range(500):
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query ~ %s",
                [query],
            ).fetchone()
            if waiting and waiting[0] >= count:
                return
            time.sleep(0.02)
    raise AssertionError(f"not {count} sessions came to wait for a lock (statements matching {query!r})")
