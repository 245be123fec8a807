"""Ingest tokens: created (the secret shown once) and checked."""

from datetime import timedelta

from django.utils import timezone

from app.api.models import IngestToken


def create_ingest_token(*, name: str) -> str:
    """Create a token for the source `name` and return its secret, which is not stored anywhere."""
    secret = IngestToken.new_secret()
    IngestToken.objects.create(name=name, token_sha256=IngestToken.digest(secret))
    return secret


# Last use is noted to the minute: a source pushing many batches a second costs one write a minute.
LAST_USE_PRECISION = timedelta(minutes=1)


def authenticate_ingest_token(secret: str) -> IngestToken | None:
    """The live token with this secret (its last use noted, to the minute), or None."""
    token = IngestToken.objects.filter(token_sha256=IngestToken.digest(secret), revoked=False).first()
    now = timezone.now()
    if token is not None and (token.last_used_at is None or now - token.last_used_at >= LAST_USE_PRECISION):
        IngestToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token
