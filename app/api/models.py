import hashlib
import secrets

from django.db import models


class IngestToken(models.Model):
    """A bearer token one data source sends with its pushes; only its sha256 is stored."""

    name = models.CharField(max_length=100, unique=True, help_text="Which source uses it, e.g. gateway-eu-1")
    token_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.name}{' (revoked)' if self.revoked else ''}"

    @staticmethod
    def digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @staticmethod
    def new_secret() -> str:
        return "psi_" + secrets.token_urlsafe(32)
