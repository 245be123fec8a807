"""Print the SQL that sums a derived table again over a window, for a migration to paste: migrations
never import app code (it changes after them), so a backfill freezes the SQL of its day."""

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from app.rollups.catalog import ROLLUPS
from app.rollups.derived import statements


class Command(BaseCommand):
    help = "Print the DELETE and INSERT that sum a derived table (by model name) over %(since)s..%(until)s."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("name", help="a sum table's model, e.g. ServerLossHour")

    def handle(self, *args: Any, **options: Any) -> None:
        found = {rollup.name: rollup for rollup in ROLLUPS if rollup.source is not None}
        rollup = found.get(options["name"])
        if rollup is None:
            raise CommandError(
                f"no derived sum table {options['name']!r}; one of: {', '.join(sorted(found))}"
            )
        sql = statements(rollup)
        self.stdout.write(f"{sql.delete};\n{sql.insert.strip()};\n")
