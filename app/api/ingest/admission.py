"""What the ingest endpoints share: the ingest token, a bounded body, a bounded number of batches at
once per process, and storing a batch (or saying why it was not).

The token is `Authorization: Bearer <secret>` (the scheme's case aside); any other header is refused,
and never logged (django-ninja's HttpBearer logged a header of another scheme whole under DEBUG).

A body over MAX_BODY_BYTES is answered 413 (Django's own limit, 2.5 MB, is meant for forms), and so is a
gzip body (`Content-Encoding: gzip`) that inflates beyond it: inflating stops there. A batch
that finds PREFIXSCOPE_INGEST_CONCURRENCY batches already being ingested by its process (a threaded
gunicorn worker; the default sync worker takes one request at a time) waits up to
PREFIXSCOPE_INGEST_WAIT_SECONDS for one of them to finish: exporters of a fleet send at once, and a
batch takes tens of milliseconds, so a short wait is no overload and refusing it would cost its sender
a whole Retry-After. Past the wait the batch is answered 429, with Retry-After, and nothing of it is
stored: its sender tries again (OTLP exporters retry 429 and honour Retry-After; REST clients are
told to). So is a batch the database did not take in time (lock or statement timeout, deadlock).
Refusals are counted in memory and added to the tally of rejected input
(`prefixscope_rejected_inputs_total{reason=~"busy|database_busy"}` in /metrics) after the next batch that is
admitted: writing them while refusing would load a database already behind.
"""

import functools
import logging
import threading
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from psycopg.errors import DeadlockDetected, LockNotAvailable, QueryCanceled

from app.api.models import IngestToken
from app.api.services import authenticate_ingest_token
from app.core.middleware import RETRY_AFTER_SECONDS as UNAVAILABLE_RETRY_AFTER_SECONDS
from app.traffic.services.rejections import count_rejected_input
from app.traffic.services.requests import IngestOutcome, Malformed, ingest_request_records
from collectors.errors import Rejection, RejectReason
from collectors.records import RequestFacts

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
RETRY_AFTER_SECONDS = 1
BUSY = Rejection(RejectReason.BUSY, "refused (429): the process was ingesting as many batches as it may")
DATABASE_BUSY = Rejection(
    RejectReason.DATABASE_BUSY, "refused (429): the database did not take the batch in time"
)
_refused: Counter[tuple[str, Rejection]] = Counter()  # (source, why) -> refusals not yet in the database
_refused_lock = threading.Lock()


def bearer_token(request: HttpRequest) -> IngestToken | None:
    """The live ingest token the request's `Authorization: Bearer` header names, else None."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    secret = secret.strip()
    return authenticate_ingest_token(secret) if scheme.lower() == "bearer" and secret else None


class NotStored(Exception):
    """Nothing of the batch was stored, and sending it again later can help: 429 or 503."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = RETRY_AFTER_SECONDS if status == 429 else UNAVAILABLE_RETRY_AFTER_SECONDS


def store_batch(
    facts: list[RequestFacts], *, source: str, default_server: str = "", malformed: list[Malformed]
) -> IngestOutcome:
    """ingest_request_records, or NotStored when the database was busy (429) or away (503)."""
    try:
        return ingest_request_records(
            facts, source=source, default_server=default_server, now=timezone.now(), malformed=malformed
        )
    except (OperationalError, InterfaceError) as exc:
        if database_busy(exc):
            logger.warning("%s batch not stored, database busy: %s", source, exc)
            note_refusal(source, DATABASE_BUSY)
            raise NotStored(429, "the database did not take the batch in time; retry later") from None
        logger.warning("%s batch not stored, database unavailable: %s", source, exc)
        raise NotStored(503, "the database is unavailable; retry later") from None


@contextmanager
def admitted(source: str) -> Iterator[bool]:
    """ingest_slot, and the refusals counted meanwhile written once the batch is done."""
    with ingest_slot(source) as slot:
        yield slot
    record_refusals()


class BodyTooLarge(ValueError):
    """The body is larger than the endpoint takes; the message says so."""


class BadEncoding(ValueError):
    """The body's Content-Encoding is not one the endpoints read, or the body is not valid in it."""


def read_body(request: HttpRequest) -> bytes:
    """The request's body, read from its stream and decoded as its Content-Encoding says (none or gzip).

    BodyTooLarge beyond MAX_BODY_BYTES, as sent or once inflated (a gzip body is inflated no further
    than that); BadEncoding for another encoding, or a gzip body that is corrupt or cut short.
    """
    declared = str(request.META.get("CONTENT_LENGTH") or "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes; send smaller batches")
    body = request.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes; send smaller batches")
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return _gunzip(body)
    raise BadEncoding(f"Content-Encoding {encoding[:40]!r} is not read here; send gzip or no encoding")


def _gunzip(body: bytes) -> bytes:
    """The inflated body, all its gzip members one after the other (as gzip.decompress reads them)."""
    inflated: list[bytes] = []
    room = MAX_BODY_BYTES  # bytes the inflated body may still take
    while body:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer
        try:
            # One byte past the room tells a body over the limit; nothing further is inflated.
            inflated.append(inflater.decompress(body, room + 1))
        except zlib.error as exc:
            raise BadEncoding(f"body: not valid gzip ({exc})") from None
        room -= len(inflated[-1])
        if room < 0:
            raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes once decompressed")
        if not inflater.eof:  # input used up (the room was not) before the member's end
            raise BadEncoding("body: gzip data cut short")
        body = inflater.unused_data  # the next member
    return b"".join(inflated)


@functools.cache
def _slots(size: int) -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(size)


_slots(settings.PREFIXSCOPE_INGEST_CONCURRENCY)  # made at start-up, before requests run in threads


@contextmanager
def ingest_slot(source: str) -> Iterator[bool]:
    """True, and a slot held until the block ends, when fewer than PREFIXSCOPE_INGEST_CONCURRENCY
    batches are being ingested in this process or one finishes within PREFIXSCOPE_INGEST_WAIT_SECONDS;
    False otherwise, the refusal counted.
    """
    slots = _slots(settings.PREFIXSCOPE_INGEST_CONCURRENCY)
    if not slots.acquire(timeout=settings.PREFIXSCOPE_INGEST_WAIT_SECONDS):
        note_refusal(source, BUSY)
        yield False
        return
    try:
        yield True
    finally:
        slots.release()


def database_busy(exc: BaseException) -> bool:
    """The database gave up on the batch (lock or statement timeout, deadlock) but is there: retry."""
    return isinstance(exc.__cause__, LockNotAvailable | QueryCanceled | DeadlockDetected)


def note_refusal(source: str, reason: Rejection) -> None:
    with _refused_lock:
        _refused[(source, reason)] += 1


def retry_later(status: int, error: str | None, *, retry_after: int = RETRY_AFTER_SECONDS) -> HttpResponse:
    """429 or 503 with Retry-After: a JSON error (app.api.errors' shape), or no body (OTLP's answer to
    throttling has none)."""
    body: dict[str, Any] = {
        "code": "busy" if status == 429 else "unavailable",
        "message": error,
        "fields": {},
    }
    answer = HttpResponse(status=status) if error is None else JsonResponse(body, status=status)
    answer["Retry-After"] = str(retry_after)
    return answer


def record_refusals() -> None:
    """Add the refusals counted in memory to the database's tally; kept for next time if it fails."""
    with _refused_lock:
        counts = _refused.copy()
        _refused.clear()
    if not counts:
        return
    try:
        with transaction.atomic():
            for (source, why), count in counts.items():
                count_rejected_input(
                    server_id=None, source=source, code=why.code, detail=why.detail, count=count,
                    now=timezone.now(),
                )  # fmt: skip
    except DatabaseError as exc:
        logger.warning("ingest refusals not recorded yet: %s", exc)
        with _refused_lock:
            _refused.update(counts)
