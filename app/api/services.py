"""Ingest tokens: created (the secret shown once) and checked."""

import threading
from datetime import timedelta

from cachetools import TTLCache
from django.utils import timezone

from app.api.models import IngestToken


def create_ingest_token(*, name: str) -> str:
    """Create a token for the source `name` and return its secret, which is not stored anywhere."""
    secret = IngestToken.new_secret()
    IngestToken.objects.create(name=name, token_sha256=IngestToken.digest(secret))
    return secret


# Last use is noted to the minute: a source pushing many batches a second costs one write a minute.
LAST_USE_PRECISION = timedelta(minutes=1)


# A live token is remembered by each web process for this long: a source sends many batches a
# second, and looking its token up for each was a tenth of an OTLP export's time. A token revoked
# (or deleted) is therefore refused within this many seconds, not at once.
TOKEN_MEMORY_SECONDS = 10
_live_tokens: TTLCache[str, IngestToken] = TTLCache(maxsize=1024, ttl=TOKEN_MEMORY_SECONDS)
_live_tokens_lock = threading.Lock()


def authenticate_ingest_token(secret: str) -> IngestToken | None:
    """The live token with this secret (its last use noted, to the minute), or None."""
    digest = IngestToken.digest(secret)
    with _live_tokens_lock:
        token = _live_tokens.get(digest)
    if token is None:
        token = IngestToken.objects.filter(token_sha256=digest, revoked=False).first()
        if token is None:
            return None
        with _live_tokens_lock:
            _live_tokens[digest] = token
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USE_PRECISION:
        IngestToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def forget_ingest_tokens() -> None:
    """Forget the tokens this process remembers: the next batch of each source looks its token up."""
    with _live_tokens_lock:
        _live_tokens.clear()
