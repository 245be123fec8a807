"""What the ingest endpoints share: a bounded body, and a bounded number of batches at once per process.

A body over MAX_BODY_BYTES is answered 413 (Django's own limit, 2.5 MB, is meant for forms). A batch
that finds PREFIXSCOPE_INGEST_CONCURRENCY batches already being ingested by its process (a threaded
gunicorn worker; the default sync worker takes one request at a time) waits up to
PREFIXSCOPE_INGEST_WAIT_SECONDS for one of them to finish: exporters of a fleet send at once, and a
batch takes tens of milliseconds, so a short wait is no overload and refusing it would cost its sender
a whole Retry-After. Past the wait the batch is answered 429, with Retry-After, and nothing of it is
stored: its sender tries again (OTLP exporters retry 429 and honour Retry-After; REST clients are
told to). So is a batch the database did not take in time (lock or statement timeout, deadlock).
Refusals are counted in memory and added to the tally of rejected input
(`prefixscope_rejected_inputs_total{reason=~"refused.*"}` in /metrics) after the next batch that is
admitted: writing them while refusing would load a database already behind.
"""

import functools
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from psycopg.errors import DeadlockDetected, LockNotAvailable, QueryCanceled

from app.traffic.services.kv_events import count_rejected_input

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
RETRY_AFTER_SECONDS = 1
BUSY = "refused (429): the process was ingesting as many batches as it may"
DATABASE_BUSY = "refused (429): the database did not take the batch in time"
_refused: Counter[tuple[str, str]] = Counter()  # (source, reason) -> refusals not yet in the database
_refused_lock = threading.Lock()


class BodyTooLarge(ValueError):
    """The body is larger than the endpoint takes; the message says so."""


def read_body(request: HttpRequest) -> bytes:
    """The request's body, read from its stream; BodyTooLarge beyond MAX_BODY_BYTES."""
    declared = str(request.META.get("CONTENT_LENGTH") or "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes; send smaller batches")
    body = request.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body larger than {MAX_BODY_BYTES} bytes; send smaller batches")
    return body


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


def note_refusal(source: str, reason: str) -> None:
    with _refused_lock:
        _refused[(source, reason)] += 1


def busy_response(error: str | None) -> HttpResponse:
    """429 with Retry-After: a JSON error, or no body (OTLP's answer to throttling carries none)."""
    answer = HttpResponse(status=429) if error is None else JsonResponse({"error": error}, status=429)
    answer["Retry-After"] = str(RETRY_AFTER_SECONDS)
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
            for (source, reason), count in counts.items():
                count_rejected_input(
                    server_id=None, source=source, reason=reason, count=count, now=timezone.now()
                )
    except DatabaseError as exc:
        logger.warning("ingest refusals not recorded yet: %s", exc)
        with _refused_lock:
            _refused.update(counts)
