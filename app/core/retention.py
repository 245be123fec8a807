"""The token-retention setting, read once for every app: app.domain.retention holds the rule."""

from datetime import datetime

from django.conf import settings

from app.domain.retention import token_ids_cutoff


def kept_token_ids_since(now: datetime) -> datetime | None:
    """Token ids of what arrived (or was pasted) at or after this are kept; None keeps none."""
    return token_ids_cutoff(
        now, days=settings.PREFIXSCOPE_TOKEN_RETENTION_DAYS, hash_only=settings.PREFIXSCOPE_HASH_ONLY
    )
