"""Run one bench: `python -m bench NAME [args]` runs bench/bench_NAME.py's `main(argv)`.

Django is set up here, once, before the bench is imported, so that no bench sets it up before its
own imports. The benches are listed in docs/benchmarks.md.
"""

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def names() -> list[str]:
    """Every bench's NAME: bench/bench_NAME.py."""
    return sorted(path.stem.removeprefix("bench_") for path in BENCH.glob("bench_*.py"))


def pages_database(argv: Sequence[str]) -> None:
    """bench_pages without DATABASE_URL: its own embedded PostgreSQL (.data/bench-postgres), kept between
    runs, with checkpoints far apart during the load (an index built after it is written to the WAL
    whole; at 1 GB they came every few seconds, each page then logged whole again). Before Django
    starts: its settings read DATABASE_URL."""
    if os.environ.get("DATABASE_URL"):
        return
    import psycopg

    from app.devservices import DATA, start_embedded_postgres

    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--database", default="bench_pages")
    database = early.parse_known_args(argv)[0].database
    os.environ["DATABASE_URL"] = start_embedded_postgres(DATA / "bench-postgres", database)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_wal_size = '4GB'")
        conn.execute("ALTER SYSTEM SET checkpoint_timeout = '20min'")
        conn.execute("SELECT pg_reload_conf()")


def main(argv: Sequence[str]) -> None:
    if not argv or argv[0] not in names():
        sys.exit(f"usage: python -m bench NAME [args]; NAME one of: {', '.join(names())}")
    name, rest = argv[0], list(argv[1:])
    if name == "pages":
        pages_database(rest)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "app.settings")
    os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver")
    import django

    django.setup()
    sys.argv = [f"python -m bench {name}", *rest]  # argparse's usage line names the command
    importlib.import_module(f"bench.bench_{name}").main(rest)


if __name__ == "__main__":
    main(sys.argv[1:])
