"""Moving a proposed server's traffic into the registered server it stands for."""

import logging
from dataclasses import dataclass
from datetime import datetime

from django.contrib.postgres.fields import ArrayField
from django.db import connection, transaction
from django.db.models import CharField

from app.fleet.models import Server
from app.fleet.services import ServerStateError, alias_merged_server, locked_server
from app.traffic.models import RequestRecord
from app.traffic.services.record_rows import INGEST_LOCK_SPACE, JOIN_WINDOW, SOURCE_MERGE

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Merged:
    moved: int  # request records now under the registered server
    joined: int  # records of requests it already had, merged into its own
    span: tuple[datetime, datetime] | None  # the first and last arrival moved; None: it had none


def move_server_records(*, server_id: int, into_id: int) -> Merged:
    """Merge a proposed server into a registered one, and delete it; its name becomes an alias of
    the registered server, so that data naming it later is stored there (fleet ServerAlias).

    Its request records move to `into`, except those of a request `into` already recorded (same
    request id, arrivals within the ingest's JOIN_WINDOW): they fill that record's gaps, as a second
    source does on ingest, and `into`'s known values stay. Its tallies of refused input add to
    `into`'s; re-summing the minutes they span is the caller's (app/rollups/merge.py). Holds both
    servers' ingest locks until the caller's transaction ends, so no batch about either is stored
    halfway through. ServerStateError when the first is no longer proposed, or `into` is proposed or
    the same server.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        for pk in sorted({server_id, into_id}):
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [INGEST_LOCK_SPACE, pk % 2**31])
        proposed, into = locked_server(server_id), locked_server(into_id)
        if proposed.state != Server.State.PROPOSED:
            raise ServerStateError(f"{proposed.name} is not proposed")
        if into.state == Server.State.PROPOSED or into.pk == proposed.pk:
            raise ServerStateError(f"{into.name} is not a registered server")
        ids = {"proposed": proposed.pk, "into": into.pk, "window": JOIN_WINDOW.total_seconds()}
        cursor.execute(_SPAN_SQL, ids)
        since, until = cursor.fetchone()
        cursor.execute(_JOIN_SQL, ids)
        cursor.execute(_DROP_JOINED_SQL, ids)
        joined = cursor.rowcount
        cursor.execute(_MOVE_SQL, ids)
        moved = cursor.rowcount
        cursor.execute(_MOVE_REJECTIONS_SQL, ids)
        proposed.delete()
        # The proposed server stays merged: a source that named it (an ingest token's name, for
        # spans without a server attribute) goes on naming it, and must not propose it again.
        alias_merged_server(name=proposed.name, into=into)
    logger.info(
        "merged proposed server %s into %s: %d records moved, %d joined", proposed, into, moved, joined
    )
    return Merged(moved=moved, joined=joined, span=None if since is None else (since, until))


def _gap_filling() -> str:
    """SET clauses: each column of `into`'s record (r) keeps its value, or takes the moved one's (p)
    where it has none; a span's source gives way to the moved one's. Built from the model, so a new
    field of request records is merged too."""
    fills = [SOURCE_MERGE.format("p")]
    for field in RequestRecord._meta.concrete_fields:
        column = field.column
        if column in ("server_id", "request_id", "arrived_at", "source"):
            continue
        if isinstance(field, ArrayField):
            fills.append(
                f"{column} = CASE WHEN cardinality(r.{column}) > 0 THEN r.{column} ELSE p.{column} END"
            )
        elif field.null:
            fills.append(f"{column} = COALESCE(r.{column}, p.{column})")
        elif isinstance(field, CharField):  # blank, not null: "" is unknown
            fills.append(f"{column} = COALESCE(NULLIF(r.{column}, ''), p.{column})")
    return ", ".join(fills)


_SAME_REQUEST = """r.server_id = %(into)s AND p.server_id = %(proposed)s AND r.request_id = p.request_id
  AND r.arrived_at BETWEEN p.arrived_at - make_interval(secs => %(window)s)
  AND p.arrived_at + make_interval(secs => %(window)s)"""
_SPAN_SQL = (
    "SELECT min(arrived_at), max(arrived_at) FROM traffic_requestrecord WHERE server_id = %(proposed)s"
)
_JOIN_SQL = f"""UPDATE traffic_requestrecord r SET {_gap_filling()}
FROM traffic_requestrecord p WHERE {_SAME_REQUEST}"""
_DROP_JOINED_SQL = f"""DELETE FROM traffic_requestrecord p WHERE p.server_id = %(proposed)s
  AND EXISTS (SELECT FROM traffic_requestrecord r WHERE {_SAME_REQUEST})"""
_MOVE_SQL = "UPDATE traffic_requestrecord SET server_id = %(into)s WHERE server_id = %(proposed)s"
_MOVE_REJECTIONS_SQL = """INSERT INTO traffic_rejectedinput AS r
  (server_id, source, reason, detail, count, first_seen_at, last_seen_at)
SELECT %(into)s, source, reason, detail, count, first_seen_at, last_seen_at
FROM traffic_rejectedinput WHERE server_id = %(proposed)s
ON CONFLICT ON CONSTRAINT rejected_input_identity DO UPDATE SET count = r.count + EXCLUDED.count,
  detail = CASE WHEN EXCLUDED.last_seen_at > r.last_seen_at THEN EXCLUDED.detail ELSE r.detail END,
  first_seen_at = LEAST(r.first_seen_at, EXCLUDED.first_seen_at),
  last_seen_at = GREATEST(r.last_seen_at, EXCLUDED.last_seen_at)"""
