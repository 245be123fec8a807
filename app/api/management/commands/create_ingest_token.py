"""Create an ingest token for one data source and print its secret (shown this once)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from app.api.services import create_ingest_token


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the source that will use it, e.g. gateway-eu-1")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        self.stdout.write(create_ingest_token(name=name))
