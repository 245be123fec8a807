"""manage.py from another shell of the same checkout finds the embedded PostgreSQL `make run` keeps
running in the data folder, without DATABASE_URL; with none running it says so in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from app.localdb import embedded_database_url

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db
SHOW_DATABASE = (
    "from django.db import connection; connection.ensure_connection(); "
    "print(connection.settings_dict['HOST'])"
)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data folder whose `postgres` is the folder of the PostgreSQL these tests run on (as
    `make run` leaves .data/postgres with its server running)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('data_directory')")
        (running,) = cursor.fetchone()
    (tmp_path / "postgres").symlink_to(running)
    return tmp_path


def manage(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """manage.py as from a new shell: no DATABASE_URL, this data folder."""
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    environment["PREFIXSCOPE_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_running_embedded_server_is_found_by_its_postmaster_file(data_dir: Path) -> None:
    url = embedded_database_url(data_dir / "postgres")
    assert url is not None and url.startswith("postgres://postgres@%2F") and url.endswith("/prefixscope")
    assert embedded_database_url(data_dir / "elsewhere") is None


def test_a_server_killed_outright_is_not_taken_for_a_running_one(data_dir: Path, tmp_path: Path) -> None:
    """Its postmaster.pid stays behind, naming a process gone."""
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / "stale"
    stale.mkdir()
    lines = (data_dir / "postgres" / "postmaster.pid").read_text().splitlines()
    (stale / "postmaster.pid").write_text("\n".join([finished.stdout.strip(), *lines[1:]]) + "\n")
    assert embedded_database_url(stale) is None


def test_manage_py_connects_to_it_without_database_url(data_dir: Path) -> None:
    answered = manage(data_dir, "shell", "-c", SHOW_DATABASE)
    assert answered.returncode == 0, answered.stderr
    socket_dir = (data_dir / "postgres" / "postmaster.pid").read_text().splitlines()[4]
    assert answered.stdout.strip().splitlines()[-1] == socket_dir  # after the shell's own line


def test_with_no_server_running_manage_py_says_so(tmp_path: Path) -> None:
    refused = manage(tmp_path, "shell", "-c", SHOW_DATABASE)
    assert refused.returncode == 1
    assert "No database: DATABASE_URL is unset and no embedded PostgreSQL is running in" in refused.stderr
    assert "Traceback" not in refused.stderr
