"""Create a personal API token for a user and print its secret (shown this once): a script's token
without a browser. It acts as that user (Authorization: Bearer psu_...)."""

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from app.api.models import PersonalToken
from app.api.services import create_personal_token

NAME_MAX = PersonalToken._meta.get_field("name").max_length or 100


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user", help="the username it acts as")
        parser.add_argument("--name", default="script", help="what it is for (default: script)")

    def handle(self, *args: Any, user: str, name: str, **options: Any) -> None:
        found = User.objects.filter(username=user).first()
        if found is None:
            raise CommandError(f"no user named {user!r}")
        if not found.is_active:
            raise CommandError(f"{user!r} is not active: a token of theirs would be refused")
        if not 0 < len(name) <= NAME_MAX:
            raise CommandError(f"--name: 1 to {NAME_MAX} characters")
        # To stdout alone, never to a log line: the secret is stored nowhere else.
        _, secret = create_personal_token(user=found, name=name)
        self.stdout.write(secret)
