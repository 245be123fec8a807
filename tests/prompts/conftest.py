"""Real git repositories built in a temporary folder with the git CLI, and what the tests share."""

import os
import subprocess
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import cast

import pytest
from django.test import Client, override_settings
from dulwich.repo import Repo
from dulwich.server import BackendRepo, DictBackend
from dulwich.web import WSGIRequestHandlerLogger, WSGIServerLogger, make_server, make_wsgi_chain

from app.api.services import create_ingest_token
from tests.support.users import fleet_viewer


class GitRepo:
    """A git repository in ``path``: files written, commits dated and authored as asked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "--quiet", "--initial-branch=main")

    def git(self, *args: str, env: dict[str, str] | None = None) -> str:
        # Neither the caller's git configuration nor inherited GIT_* variables: signing or hooks set
        # up for real work must not change the commits.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        clean.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
        clean.update(GIT_COMMITTER_NAME="Release Bot", GIT_COMMITTER_EMAIL="bot@example.com")  # tags, merges
        clean.update(GIT_AUTHOR_NAME="Release Bot", GIT_AUTHOR_EMAIL="bot@example.com")
        clean.update(env or {})
        done = subprocess.run(
            ["git", *args], cwd=self.path, env=clean, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    def write(self, path: str, text: str) -> None:
        file = self.path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")

    def commit(
        self, message: str, *, when: datetime, author: str = "Ada Lovelace", email: str = "ada@example.com"
    ) -> str:
        """Commit everything in the work tree (empty commits too); the new commit's sha."""
        self.git("add", "--all")
        date = when.isoformat()
        identity = {
            "GIT_AUTHOR_NAME": author, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_NAME": author, "GIT_COMMITTER_EMAIL": email, "GIT_COMMITTER_DATE": date,
        }  # fmt: skip
        self.git("commit", "--quiet", "--no-verify", "--allow-empty", "-m", message, env=identity)
        return self.git("rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    return GitRepo(tmp_path / "prompts")


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path) -> Iterator[None]:
    """Repositories fetched by URL are mirrored under the test's own folder."""
    with override_settings(PREFIXSCOPE_TEMPLATE_CACHE_DIR=tmp_path / "cache"):
        yield


@pytest.fixture
def remote(repo: GitRepo) -> Iterator[str]:
    """``repo`` served over git's smart HTTP by dulwich's own server, as a forge serves it: its URL."""
    served = Repo(str(repo.path))
    app = make_wsgi_chain(DictBackend({"/acme/prompts.git": cast(BackendRepo, served)}))
    server = make_server(
        "127.0.0.1", 0, app, handler_class=WSGIRequestHandlerLogger, server_class=WSGIServerLogger
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/acme/prompts.git"
    server.shutdown()
    server.server_close()
    served.close()


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(fleet_viewer("admin", is_staff=True))
    return client


@pytest.fixture
def engineer(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


@pytest.fixture
def token() -> str:
    return create_ingest_token(name="ci")
