"""The diagnosis of request records: why each one's prompt tokens were not reused, and its funnel.

Each run takes the records not diagnosed yet that arrived in the last PREFIXSCOPE_DIAGNOSIS_LOOKBACK
_MINUTES, up to PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS ago (KV events and spans arrive late: a record is
diagnosed once, after they had time to), and replays in time order the fleet's KV events and the
records from one lookback before the first of them (app/domain/misscauses.py). A record is written
once (ON CONFLICT DO NOTHING): a redelivered task, or two runs at once, diagnose it the same and
store it once. Records that arrive later than the lookback are left undiagnosed.

Servers are compared within compatibility groups (model, block size, hash algorithm): a block of
one is never "resident elsewhere" on another model's server. A server whose KV events are not
collected (no KV stream) gets `no_kv_events` wherever residency would have to be known.

A prompt is compared with the earlier ones of its template, or, when it has none, of its prefix
family (app/prompts/models.py PrefixFamily): a family is to the diagnosis what a template is.
"""

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection

from app.domain.misscauses import BlockEvent, Diagnosis, EventKind, FleetHistory, Loss, RequestPrompt, Unknown
from app.fleet.models import Server
from app.traffic.models import KVStream, RequestDiagnosis
from app.traffic.services.partitions import ensure_day_partitions

logger = logging.getLogger(__name__)

_RECORDS_SQL = """
SELECT r.server_id, r.request_id, r.arrived_at, r.tenant, r.template_id, r.template_version_id,
       r.prompt_tokens, r.cached_tokens, r.salt_hash, r.block_hashes, r.neutral_hashes, r.token_ids,
       COALESCE(r.client_ttft_seconds, r.server_ttft_seconds), r.family_id,
       (d.request_id IS NOT NULL) AS diagnosed
FROM traffic_requestrecord r
LEFT JOIN traffic_requestdiagnosis d
  ON d.server_id = r.server_id AND d.request_id = r.request_id AND d.arrived_at = r.arrived_at
WHERE r.arrived_at >= %s AND r.arrived_at < %s
ORDER BY r.arrived_at, r.server_id, r.request_id
"""
# Signed hashes, as the records' chains hold them (the model's UInt64Field would map them to wire).
_EVENTS_SQL = """
SELECT server_id, dp_rank, epoch, emitted_at, kind, block_hash FROM traffic_kvevent
WHERE emitted_at >= %s AND emitted_at < %s
ORDER BY emitted_at, server_id, dp_rank, epoch, seq, event_index, block_index
"""
_FETCH = 2000


@dataclass(frozen=True, slots=True)
class _Record:
    key: tuple[int, str, datetime]
    template_id: int | None
    template_version_id: int | None
    tenant: str
    prompt: RequestPrompt
    diagnosed: bool


def diagnose_requests(*, now: datetime) -> int:
    """Diagnose the records due (see the module's docstring); returns how many were stored."""
    until = now - timedelta(seconds=settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS)
    lookback = timedelta(minutes=settings.PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES)
    servers = {server.pk: server for server in Server.objects.all()}
    streaming = set(KVStream.objects.values_list("server_id", flat=True))
    due = _first_undiagnosed(since=until - lookback, until=until)
    if due is None:
        return 0
    history = FleetHistory(groups={pk: (s.model, s.block_size, s.hash_algo) for pk, s in servers.items()})
    events = _events(since=due - lookback, until=until)
    pending = next(events, None)
    found: list[tuple[_Record, Diagnosis | Unknown]] = []
    for record in _records(since=due - lookback, until=until, servers=servers, streaming=streaming):
        while pending is not None and pending.at <= record.prompt.arrived_at:
            history.apply(pending)
            pending = next(events, None)
        if record.diagnosed:
            history.remember(record.prompt)
        else:
            found.append((record, history.diagnose(record.prompt)))
    while pending is not None:  # the rest, for the requests still waiting for their first token
        history.apply(pending)
        pending = next(events, None)
    # Events after a request's arrival may have revised it (a block evicted while it waited).
    return _store([_stored(r, history.revised.get(r.key, diagnosis), now=now) for r, diagnosis in found])


def _first_undiagnosed(*, since: datetime, until: datetime) -> datetime | None:
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT min(r.arrived_at) FROM traffic_requestrecord r
            WHERE r.arrived_at >= %s AND r.arrived_at < %s AND NOT EXISTS (
              SELECT FROM traffic_requestdiagnosis d WHERE d.server_id = r.server_id
                AND d.request_id = r.request_id AND d.arrived_at = r.arrived_at)""",
            [since, until],
        )
        (first,) = cursor.fetchone()
    return first  # type: ignore[no-any-return]


def _events(*, since: datetime, until: datetime) -> Iterator[BlockEvent]:
    with connection.cursor() as cursor:
        cursor.execute(_EVENTS_SQL, [since, until])
        while rows := cursor.fetchmany(_FETCH):
            for server, rank, epoch, emitted_at, kind, block_hash in rows:
                yield BlockEvent(server, rank, epoch, emitted_at, EventKind(kind), block_hash)


def _records(
    *, since: datetime, until: datetime, servers: dict[int, Server], streaming: set[int]
) -> Iterator[_Record]:
    # A named cursor: the window's records stream from the server, not all in memory at once.
    with connection.chunked_cursor() as cursor:
        cursor.execute(_RECORDS_SQL, [since, until])
        while rows := cursor.fetchmany(_FETCH):
            for row in rows:
                yield _record(row, servers[row[0]], kv_events=row[0] in streaming)


def _record(row: tuple[Any, ...], server: Server, *, kv_events: bool) -> _Record:
    (server_id, request_id, arrived_at, tenant, template_id, version_id,
     prompt_tokens, cached_tokens, salt_hash, block_hashes, neutral, token_ids, ttft, family_id,
     diagnosed) = row  # fmt: skip
    prompt = RequestPrompt(
        server=server_id, arrived_at=arrived_at, block_size=server.block_size, prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens, block_hashes=block_hashes or (), salt=salt_hash,
        neutral_hashes=neutral or (),
        family=_family(template_id, family_id), token_ids=token_ids, kv_events=kv_events,
        first_token_at=arrived_at + timedelta(seconds=ttft) if ttft is not None else None,
        key=(server_id, request_id, arrived_at),
    )  # fmt: skip
    return _Record((server_id, request_id, arrived_at), template_id, version_id, tenant, prompt, diagnosed)


def _family(template_id: int | None, family_id: int | None) -> tuple[str, int] | None:
    """What the prompt is compared with: its template, else its prefix family (ids of two tables,
    kept apart), else nothing (None: the records with neither, together)."""
    if template_id is not None:
        return ("template", template_id)
    return ("family", family_id) if family_id is not None else None


def _stored(record: _Record, found: Diagnosis | Unknown, *, now: datetime) -> RequestDiagnosis:
    server_id, request_id, arrived_at = record.key
    row = RequestDiagnosis(
        server_id=server_id, request_id=request_id, arrived_at=arrived_at, diagnosed_at=now,
        template_id=record.template_id, template_version_id=record.template_version_id, tenant=record.tenant,
        prompt_tokens=record.prompt.prompt_tokens or 0,
    )  # fmt: skip
    if isinstance(found, Unknown):
        row.unknown = found.value
        return row
    row.cause = found.cause.value if found.cause else ""
    row.diverged_at, row.unexpected_hit = found.diverged_at, found.unexpected_hit
    funnel = found.funnel
    row.seen_before_tokens, row.resident_anywhere_tokens = funnel.seen_before, funnel.resident_anywhere
    row.resident_here_tokens, row.reused_tokens = funnel.resident_here, funnel.reused
    for cause, tokens in found.tokens_by_cause().items():
        setattr(row, f"{cause.value}_tokens", tokens)
    row.losses = [_loss_json(loss) for loss in found.losses]
    return row


def _loss_json(loss: Loss) -> dict[str, object]:
    found: dict[str, object] = {
        "cause": loss.cause.value,
        "first_token": loss.first_token,
        "tokens": loss.tokens,
    }
    if loss.server is not None:
        found["server_id"] = loss.server
    if loss.server_tokens is not None:
        found["server_tokens"] = loss.server_tokens
    for name in ("stored_at", "removed_at"):
        if (moment := getattr(loss, name)) is not None:
            found[name] = moment.isoformat()
    return found


def _store(rows: list[RequestDiagnosis]) -> int:
    if not rows:
        return 0
    ensure_day_partitions(RequestDiagnosis, [row.arrived_at for row in rows])
    RequestDiagnosis.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
    counts = Counter(row.cause or row.unknown or "reused" for row in rows)
    logger.info("requests diagnosed", extra={"diagnosed": len(rows), "by_cause": counts})
    return len(rows)
