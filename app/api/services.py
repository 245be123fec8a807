"""API tokens: ingest tokens (one per data source, they push) and personal tokens (one user's, they
read as that user), each created with its secret shown once, checked, and revoked."""

import logging
import threading
from datetime import datetime, timedelta

from cachetools import TTLCache
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from app.api.models import IngestToken, PersonalToken, secret_digest

logger = logging.getLogger(__name__)


class NameTaken(ValueError):
    """Another ingest token has that name (a revoked one too: its name stays in the audit trail)."""


def create_ingest_token(*, name: str) -> str:
    """Create a token for the source `name` and return its secret, which is not stored anywhere.
    NameTaken when a token of that name exists."""
    secret = IngestToken.new_secret()
    try:
        with transaction.atomic():
            IngestToken.objects.create(name=name, token_sha256=IngestToken.digest(secret))
    except IntegrityError:
        raise NameTaken(f"an ingest token named {name} exists already") from None
    logger.info("created ingest token %s", name)
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


def revoke_ingest_token(*, token_id: int) -> IngestToken:
    """Revoke the token: its source's next batch is refused (this process forgets the tokens it
    remembers; another web process within TOKEN_MEMORY_SECONDS). Revoking twice is no error."""
    token = IngestToken.objects.get(pk=token_id)
    if not token.revoked:
        IngestToken.objects.filter(pk=token_id).update(revoked=True)
        token.revoked = True
        logger.info("revoked ingest token %s", token.name)
    forget_ingest_tokens()
    return token


def create_personal_token(*, user: User, name: str) -> tuple[PersonalToken, str]:
    """A new API token of `user`'s and its secret, which is not stored anywhere (shown once)."""
    secret = PersonalToken.new_secret()
    token = PersonalToken.objects.create(user=user, name=name, token_sha256=secret_digest(secret))
    logger.info("user %s created API token %s", user.get_username(), name)
    return token, secret


def revoke_personal_token(*, user: User, token_id: int, now: datetime) -> PersonalToken:
    """Revoke one of `user`'s own tokens; the next call with it is refused. PersonalToken.DoesNotExist
    for another user's token (as for none): nobody revokes a token not theirs."""
    token = PersonalToken.objects.get(pk=token_id, user=user)
    if token.revoked_at is None:
        PersonalToken.objects.filter(pk=token_id).update(revoked_at=now)
        token.revoked_at = now
        logger.info("user %s revoked API token %s", user.get_username(), token.name)
    return token


def authenticate_personal_token(secret: str, *, now: datetime) -> PersonalToken | None:
    """The live token with this secret, of an active user (its last use noted, to the minute), or
    None. Looked up every call, unlike ingest tokens: a revoked one is refused at once."""
    token = (
        PersonalToken.objects.select_related("user")
        .filter(token_sha256=secret_digest(secret), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is not None and (token.last_used_at is None or now - token.last_used_at >= LAST_USE_PRECISION):
        PersonalToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
