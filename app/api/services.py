"""Ingest tokens: created (the secret shown once) and checked."""

from django.utils import timezone

from app.api.models import IngestToken


def create_ingest_token(*, name: str) -> str:
    """Create a token for the source `name` and return its secret, which is not stored anywhere."""
    secret = IngestToken.new_secret()
    IngestToken.objects.create(name=name, token_sha256=IngestToken.digest(secret))
    return secret


def authenticate_ingest_token(secret: str) -> IngestToken | None:
    """The live token with this secret (its last use noted), or None."""
    token = IngestToken.objects.filter(token_sha256=IngestToken.digest(secret), revoked=False).first()
    if token is not None:
        IngestToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token
