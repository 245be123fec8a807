"""Detect regressions over history: the online detection run once per minute from --since to now."""

from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from app.regressions.services import detect_regressions


class Command(BaseCommand):
    help = (
        "Run the regression detection as it would have run online, once per minute from --since to now: "
        "it opens, updates and resolves the same regressions (and a rerun none twice)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, help="A date (2026-12-01) or an ISO 8601 time")

    def handle(self, *args: Any, **options: Any) -> None:
        since = _moment(options["since"])
        now, opened, step = timezone.now(), 0, since.replace(second=0, microsecond=0)
        while step <= now:
            opened += detect_regressions(now=step)
            step += timedelta(minutes=1)
        self.stdout.write(f"{opened} regressions opened")


def _moment(text: str) -> datetime:
    moment = parse_datetime(text)
    if moment is None and (day := parse_date(text)) is not None:
        moment = datetime(day.year, day.month, day.day)
    if moment is None:
        raise CommandError(f"--since {text!r} is neither a date nor an ISO 8601 time")
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)
