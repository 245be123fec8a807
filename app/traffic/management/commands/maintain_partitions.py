"""Create the daily partitions due ahead and drop those past retention (also run hourly by beat)."""

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from app.traffic.services.partitions import maintain_partitions


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: Any, **options: Any) -> None:
        changes = maintain_partitions(now=timezone.now())
        self.stdout.write(f"partitions: {len(changes.created)} created, {len(changes.dropped)} dropped")
