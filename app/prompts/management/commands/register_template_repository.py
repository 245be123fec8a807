"""Register a template repository (or update the one of that name), and import it now if asked."""

import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from app.prompts import history, services
from app.prompts.git import is_url
from app.prompts.models import TemplateRepository


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("location", help="a local path (made absolute) or an http(s):// or file:// URL")
        parser.add_argument(
            "--glob", action="append", required=True, help="template files, e.g. templates/*.j2 (repeatable)"
        )
        parser.add_argument("--branch", default="", help="the branch or ref to follow (default: HEAD)")
        parser.add_argument("--name", default="", help="default: the location's last part")
        parser.add_argument(
            "--secret-env", metavar="NAME", help="the environment variable holding the webhook secret"
        )
        parser.add_argument("--import-now", action="store_true", help="import its history now, here")

    def handle(
        self, *args: Any, location: str, glob: list[str], branch: str, name: str, **options: Any
    ) -> None:
        location = location if is_url(location) else str(Path(location).resolve())
        secret = self._secret(options["secret_env"])
        existing = TemplateRepository.objects.filter(name=name or services.default_name(location)).first()
        try:
            if existing is not None:
                repository = services.update_repository(
                    existing, location=location, globs=glob, branch=branch, secret=secret
                )
            else:
                repository = services.register_repository(
                    location=location, globs=glob, branch=branch, secret=secret or "", name=name
                )
        except (ValueError, services.RepositoryConflict) as exc:
            raise CommandError(str(exc)) from None
        done = "updated" if existing else "registered"
        self.stdout.write(f"{done} template repository {repository.name} (id {repository.pk})")
        if options["import_now"]:
            self._import(repository)

    def _secret(self, variable: str | None) -> str | None:
        """The secret from the environment (never from the command line, where `ps` shows it)."""
        if variable is None:
            return None
        if not os.environ.get(variable):
            raise CommandError(f"{variable} is not set (or empty)")
        return os.environ[variable]

    def _import(self, repository: TemplateRepository) -> None:
        def progress(done: int, total: int) -> None:
            self.stdout.write(f"  {done}/{total} commits")

        try:
            outcome = history.import_template_history(
                repository_id=repository.pk, now=timezone.now(), progress=progress
            )
        except history.ImportBusy:
            raise CommandError(
                f"{repository.name} is being imported elsewhere; it will be current then"
            ) from None
        except KeyboardInterrupt:  # stopped (Ctrl-C): the repository's row says so, no traceback
            raise SystemExit(130) from None
        if outcome.error:
            raise CommandError(f"import of {repository.name} failed: {outcome.error}")
        self.stdout.write(
            f"imported {outcome.commits} commits of {repository.name}: {outcome.versions} versions"
        )
