"""The Dockerfile builds the locked dependencies and static files, and runs gunicorn unprivileged."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS = [
    line.strip()
    for line in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]


def instructions(keyword: str) -> list[str]:
    return [line.split(None, 1)[1] for line in INSTRUCTIONS if line.split()[0].upper() == keyword]


def test_the_image_starts_from_python_3_11_slim() -> None:
    # The last stage is the image; the one before only installs the browser's libraries with npm.
    assert instructions("FROM")[-1] == "python:3.11-slim"


def test_the_chart_library_is_installed_by_npm_from_the_lock_before_static_files_are_collected() -> None:
    assert instructions("FROM")[:-1] == ["node:20-slim AS browser-libraries"]
    assert "npm ci --no-audit --no-fund" in instructions("RUN")
    copies = instructions("COPY")
    assert "package.json package-lock.json ./" in copies
    installed = copies.index("--from=browser-libraries /build/node_modules ./node_modules")
    assert copies.index(". .") < installed  # the host's node_modules never enters (.dockerignore)
    assert "node_modules" in (ROOT / ".dockerignore").read_text().split()
    # collectstatic, in the last RUN that names it, comes after the copy (instructions are in order).
    order = [line.split(None, 1)[1] for line in INSTRUCTIONS]
    copy_at = order.index("--from=browser-libraries /build/node_modules ./node_modules")
    assert any("collectstatic" in line for line in order[copy_at:])


def test_locked_dependencies_install_before_the_project_and_static_files_are_collected() -> None:
    runs = " ".join(instructions("RUN"))
    lock = runs.index("pip install -r requirements.lock")
    project = runs.index("pip install --no-deps -e .")
    assert lock < project < runs.index("manage.py collectstatic --noinput")


def test_the_block_hash_chain_in_c_is_built_beside_the_source_it_runs_from() -> None:
    # PYTHONPATH=/app imports the source tree, so the extension must land there: an editable
    # install builds it in place, with a compiler and OpenSSL's headers installed before.
    runs = " ".join(instructions("RUN"))
    assert runs.index("gcc") < runs.index("pip install --no-deps -e .")
    assert "libssl-dev" in runs
    assert "**/*.so" in (ROOT / ".dockerignore").read_text().split()  # never a host's build


def test_the_process_runs_as_a_user_other_than_root() -> None:
    assert instructions("USER")[-1] not in {"root", "0"}


def test_the_default_command_is_gunicorn_on_port_8000() -> None:
    assert json.loads(instructions("CMD")[-1]) == [
        "gunicorn",
        "app.wsgi:application",
        "--bind",
        "0.0.0.0:8000",
    ]


def test_local_state_stays_out_of_the_build_context() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".data", ".git"} <= set(ignored)
    assert any("__pycache__" in pattern for pattern in ignored)
