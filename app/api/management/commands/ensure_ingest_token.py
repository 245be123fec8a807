"""Make sure an ingest token with this name and secret exists (local set-ups that keep the secret)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from app.api.models import IngestToken


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--secret", required=True)

    def handle(self, *args: Any, name: str, secret: str, **options: Any) -> None:
        IngestToken.objects.update_or_create(
            name=name, defaults={"token_sha256": IngestToken.digest(secret), "revoked": False}
        )
        self.stdout.write(f"ingest token {name} ready")
