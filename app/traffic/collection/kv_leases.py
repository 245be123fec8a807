"""Leases on the servers' KV-event streams: several `collect_kv_events` processes share a fleet.

A lease is a session-level advisory lock, pg_try_advisory_lock(LEASE_SPACE, server id), held on a
connection each subscriber process keeps for its leases alone. Why not a lease row with an expiry
renewed on a heartbeat:
- A process killed with SIGKILL has its connection closed by the kernel: its backend sees the end
  of the stream at once and ends, its locks with it. The others take its servers at their next
  check (one lease period). A row would hold them until it expired: the heartbeat plus a margin for
  a late heartbeat, more than a lease period.
- Keeping a lease writes nothing: no UPDATE per server per heartbeat (dead tuples, vacuum) and no
  clocks to compare between processes.
- A host that vanishes without closing its connection (power cut, partition) is noticed by TCP
  keepalive alone: the lease connection sets the server's keepalives to about a lease period.
- The connection is used for nothing else, so Django's connection (closed and opened again on an
  error, or after CONN_MAX_AGE) never drops the locks with it.

Each process also holds a member lock (MEMBER_SPACE, its backend pid), so that every process can
count the live subscribers and hold its fair share of the servers, ceil(servers / subscribers):
the first to start takes every server, gives the extra up when a second one starts, and takes a
killed one's servers when it is gone. A process that holds no lease holds no server's stream.
"""

import contextlib
import logging
import math
import os
import socket
from collections.abc import Collection, Iterable

import psycopg
from django.db import connection, connections

from app.traffic.collection.processes import LeaseCounts

logger = logging.getLogger(__name__)

LEASE_SPACE = 0x4B56_4C31  # pg_try_advisory_lock's first key: a server's KV-event stream ("KVL1")
MEMBER_SPACE = 0x4B56_4D31  # a subscriber process's presence ("KVM1")
APPLICATION_NAME = "prefixscope-kv-subscriber"

# Advisory locks of this database (pg_locks lists every database's) in one key space; two-key
# locks have objsubid 2, and their second key in objid.
_HELD_SQL = """
SELECT l.objid::int8, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objsubid = 2 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def share_of(servers: int, subscribers: int) -> int:
    """How many servers one of `subscribers` processes holds at most: every server is held by one."""
    return math.ceil(servers / max(subscribers, 1))


def lease_holders() -> dict[int, str]:
    """Each leased server's id, with the application name of the process holding it (name:pid)."""
    with connection.cursor() as cursor:
        cursor.execute(_HELD_SQL, [LEASE_SPACE])
        return dict(cursor.fetchall())


class Leases:
    """This process's leases, on a connection of their own (opened by `connect`)."""

    def __init__(self, *, lease_seconds: float, name: str = "") -> None:
        """`name` (the lease connection's application name) defaults to the subscriber's, host
        and process id: `lease_holders` says which process holds what."""
        self.lease_seconds = lease_seconds
        self.name = name or f"{APPLICATION_NAME}:{socket.gethostname()[:24]}:{os.getpid()}"
        self.held: set[int] = set()
        # Since the process started, for /metrics: a process that keeps taking and losing or giving up
        # leases (flapping) hands its servers' streams from one subscriber to another over and over.
        self.taken_count = self.lost_count = self.released_count = 0
        self._connection: psycopg.Connection[tuple[object, ...]] | None = None

    def connect(self) -> set[int]:
        """(Re)open the lease connection if it is closed or broke; returns the leases lost with it.

        Leases held before are taken again; those another process took meanwhile are lost (the
        caller stops collecting them). Raises psycopg.OperationalError while PostgreSQL is away.
        """
        if self._connection is not None and not self._connection.closed and not self._connection.broken:
            return set()
        if self._connection is not None:
            self._connection.close()
        params = connections["default"].get_connection_params()
        params.pop("cursor_factory", None)
        params["application_name"] = self.name[:63]  # pg_stat_activity names who holds which lease
        self._connection = psycopg.connect(**params, autocommit=True)
        keepalive = max(1, round(self.lease_seconds / 3))
        for setting in ("tcp_keepalives_idle", "tcp_keepalives_interval"):
            self._connection.execute(f"SET {setting} = {keepalive}")
        self._connection.execute("SET tcp_keepalives_count = 3")
        self._connection.execute("SELECT pg_advisory_lock(%s::int4, pg_backend_pid())", [MEMBER_SPACE])
        before, self.held = self.held, set()
        lost = before - self.take(before, limit=len(before))
        self.lost_count += len(lost)
        if lost:
            logger.warning("leases lost with the lease connection: servers %s", sorted(lost))
        return lost

    def excess(self, servers: Collection[int]) -> set[int]:
        """The leases to give up: servers no longer to collect, and those above this process's share."""
        gone = self.held - set(servers)
        kept = sorted(self.held - gone)
        return gone | set(kept[share_of(len(servers), self._subscribers()) :])

    def take_share(self, servers: Iterable[int]) -> set[int]:
        """Take free servers' leases up to this process's share; returns those taken."""
        listed = sorted(servers)
        room = share_of(len(listed), self._subscribers()) - len(self.held)
        if room <= 0:
            return set()
        taken_by_others = set(self._holders(LEASE_SPACE)) - self.held
        taken = self.take([pk for pk in listed if pk not in self.held | taken_by_others], limit=room)
        self.taken_count += len(taken)
        return taken

    def take(self, servers: Iterable[int], *, limit: int) -> set[int]:
        """Try the leases of `servers` in turn until `limit` are taken; returns those taken."""
        taken: set[int] = set()
        for pk in servers:
            if len(taken) >= limit:
                break
            if self._execute("SELECT pg_try_advisory_lock(%s::int4, %s::int4)", LEASE_SPACE, pk):
                taken.add(pk)
        self.held |= taken
        return taken

    def release(self, servers: Iterable[int]) -> None:
        for pk in servers:
            self._execute("SELECT pg_advisory_unlock(%s::int4, %s::int4)", LEASE_SPACE, pk)
            self.held.discard(pk)
            self.released_count += 1

    def counts(self) -> LeaseCounts:
        return LeaseCounts(
            held=len(self.held), taken=self.taken_count, lost=self.lost_count, released=self.released_count
        )

    def close(self) -> None:
        """Give every lease up. Unlocked first: closing the connection ends its locks too, but the
        server process lets them go after the close returns, so another subscriber asking at once
        could still find them held (a killed process's pass within a lease period, as designed)."""
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):  # a broken connection's locks are gone already
                self._connection.execute("SELECT pg_advisory_unlock_all()")
            self._connection.close()
        self._connection, self.held = None, set()

    def _subscribers(self) -> int:
        return len(self._holders(MEMBER_SPACE))

    def _holders(self, space: int) -> dict[int, str]:
        assert self._connection is not None
        return dict(self._connection.execute(_HELD_SQL, [space]).fetchall())  # type: ignore[arg-type]

    def _execute(self, sql: str, *params: int) -> object:
        assert self._connection is not None
        row = self._connection.execute(sql, params).fetchone()
        return None if row is None else row[0]
