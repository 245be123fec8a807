import hashlib
import secrets

from django.conf import settings
from django.db import models


def secret_digest(secret: str) -> str:
    """What is stored of a token's secret: its sha256, hex (the secrets are random: no salt needed)."""
    return hashlib.sha256(secret.encode()).hexdigest()


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
        return secret_digest(token)

    @staticmethod
    def new_secret() -> str:
        return "psi_" + secrets.token_urlsafe(32)


class PersonalToken(models.Model):
    """A user's own API token: it reads (and, for staff, writes) the API as that user, never ingests.
    Only its sha256 is stored; the secret is shown once, when it is created."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What it is for, e.g. grafana or my laptop")
    token_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.user}){' (revoked)' if self.revoked_at else ''}"

    @staticmethod
    def new_secret() -> str:
        return "psu_" + secrets.token_urlsafe(32)
