"""Create or update the `admin` superuser whose password `make run` prints (local use only)."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create the admin superuser, or reset its password, from --password."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", required=True)

    def handle(self, *args: Any, username: str, password: str, **options: Any) -> None:
        user, created = get_user_model().objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        if created or not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
        self.stdout.write(f"{'created' if created else 'kept'} superuser {username}")
