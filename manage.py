#!/usr/bin/env python
"""Django's command-line utility for administrative tasks.

Without DATABASE_URL, settings find the embedded PostgreSQL that `make run` keeps running in this
checkout's data folder (app/localdb.py); when there is none and no local server answers either, a
command that needs the database says so in one line instead of a driver's traceback.
"""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "app.settings")
    from django.core.management import execute_from_command_line
    from django.db import OperationalError

    try:
        execute_from_command_line(sys.argv)
    except OperationalError:
        from django.conf import settings

        from app.localdb import LOCAL_URL, no_database_message

        if os.environ.get("DATABASE_URL") or settings.DATABASE_URL != LOCAL_URL:
            raise  # a database was named or found: its own error is the one to read
        sys.exit(no_database_message(settings.PREFIXSCOPE_DATA_DIR))


if __name__ == "__main__":
    main()
