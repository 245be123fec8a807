"""A scenario's prompt templates as an ordinary git repository: one commit per template version.

``create_repo`` commits each template as ``templates/<name>.j2`` (one commit per template, at the
scenario's virtual second 0, the first with the describing file ``prefixscope.yaml`` that
Prefixscope's template check reads: simulator/template_describe.py), then each template change of
the timeline as its own commit dated at ``start`` plus its virtual time, so ``git log`` shows when
each version went live. Prefixscope imports this history like any prompt-template repository;
requests name their version by commit sha (``version_at``). Git runs as a subprocess with the
caller's ``git`` on PATH.

``stage_repo`` does the same as a real repository grows: the whole history is committed in a
staging copy (the author's), the repository holds the commits up to now, and ``push`` brings each
later one when the scenario reaches it (a fast-forward push, as its author's would be).
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from simulator.scenario import Scenario, TemplateChange
from simulator.template_describe import CONFIG_FILE, describe

logger = logging.getLogger(__name__)

AUTHOR_NAME = "Prefixscope simulator"
AUTHOR_EMAIL = "simulator@prefixscope.invalid"


class TemplateRepoError(RuntimeError):
    """The repository could not be created: the folder is not empty, or a git command failed."""


@dataclass(frozen=True, slots=True)
class TemplateVersion:
    """One version of a template, before it is committed: the whole ``text`` as of virtual second ``at``."""

    template: str
    at: float
    text: str
    message: str


@dataclass(frozen=True, slots=True)
class Commit:
    """A committed template version. ``time`` is virtual seconds; ``path`` is the file in the repository."""

    sha: str
    template: str
    time: float
    message: str
    path: str
    text: str


def template_file(name: str) -> str:
    """The repository path of a template: ``templates/<name>.j2``."""
    return f"templates/{name}.j2"


def template_versions(scenario: Scenario) -> list[TemplateVersion]:
    """Every template version of a scenario in commit order: the initial texts, then the timeline's changes.

    Pure: no git. The initial versions are at 0, one per template, in the scenario's order.
    """
    initial = [
        TemplateVersion(t.name, 0.0, t.text, f"Add the {t.name} prompt template ({t.kind})")
        for t in scenario.templates
    ]
    changes = [
        TemplateVersion(event.template, event.at, event.text, event.message)
        for event in scenario.timeline
        if isinstance(event, TemplateChange)
    ]
    return initial + changes


def create_repo(path: Path, scenario: Scenario, start: datetime) -> list[Commit]:
    """Create a git repository at ``path`` holding the scenario's template history; return its commits.

    ``path`` is created if missing and must be empty. ``start`` (timezone-aware) is virtual second 0;
    a version at virtual second t gets author and committer date ``start + t``, rounded down to whole
    seconds (git's resolution) while ``Commit.time`` keeps t exactly. Commits are returned in commit
    order; a change that leaves the text as it was still gets its commit (empty). The branch is
    ``main``; the caller's git configuration and hooks are not used, so signing or hooks set up for
    real work cannot interfere. Raises ValueError for a naive ``start``, TemplateRepoError otherwise.
    """
    if start.tzinfo is None:
        raise ValueError("start must be timezone-aware")
    _init(path)
    # The describing file goes in with the first template, so every commit can be checked.
    (path / CONFIG_FILE).write_text(describe(scenario, scenario.servers.block_size, start), encoding="utf-8")
    _git(path, "add", CONFIG_FILE)
    commits = [_commit(path, version, start) for version in template_versions(scenario)]
    logger.info("created template repository %s with %d commits", path, len(commits))
    return commits


def stage_repo(path: Path, staging: Path, scenario: Scenario, start: datetime) -> list[Commit]:
    """Commit the scenario's whole history in ``staging`` (as ``create_repo``) and make ``path`` a
    repository that holds those at virtual second 0 or before only; return every commit.

    Both folders must be empty or missing. The later commits reach ``path`` by ``push`` when they are
    due; they are not in its object database before (a ``git log --all`` there shows what is live).
    ``path`` accepts pushes to its checked-out ``main`` and updates its work tree with them.
    """
    commits = create_repo(staging, scenario, start)
    _init(path)
    _git(path, "config", "receive.denyCurrentBranch", "updateInstead")
    live = [commit for commit in commits if commit.time <= 0]
    if live:
        push(staging, path, live[-1])
    return commits


def push(staging: Path, path: Path, commit: Commit) -> None:
    """Push ``commit`` and those before it from ``staging`` to ``path``'s ``main``, fast-forward only.
    Raises TemplateRepoError when git refuses (not a descendant of ``path``'s ``main``, say)."""
    _git(staging, "push", "--quiet", str(path.resolve()), f"{commit.sha}:refs/heads/main")


def version_at(commits: Sequence[Commit], template: str, t: float) -> str | None:
    """The sha of the template's version live at virtual second ``t``; None before its first commit.

    A commit at exactly ``t`` is live at ``t``. Of commits at the same time the later in the list wins,
    as it was committed last. The list need not be sorted.
    """
    live: Commit | None = None
    for commit in commits:
        if commit.template == template and commit.time <= t and (live is None or commit.time >= live.time):
            live = commit
    return None if live is None else live.sha


def _init(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise TemplateRepoError(f"{path} is not empty")
    _git(path, "init", "--quiet", "--initial-branch=main")


def _commit(path: Path, version: TemplateVersion, start: datetime) -> Commit:
    relative = template_file(version.template)
    file = path / relative
    file.parent.mkdir(exist_ok=True)
    file.write_text(version.text, encoding="utf-8")
    _git(path, "add", relative)
    date = f"@{math.floor(start.timestamp() + version.at)} +0000"
    dates = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    _git(path, "commit", "--quiet", "--no-verify", "--allow-empty", "-m", version.message, extra_env=dates)
    sha = _git(path, "rev-parse", "HEAD").strip()
    return Commit(
        sha=sha,
        template=version.template,
        time=version.at,
        message=version.message,
        path=relative,
        text=version.text,
    )


def _git(path: Path, *args: str, extra_env: dict[str, str] | None = None) -> str:
    """Run git in ``path``; its stdout. Raises TemplateRepoError with git's message when it fails."""
    # Inherited GIT_* variables (GIT_DIR inside a hook, say) would point git at another repository,
    # and the caller's config could sign commits or run hooks: start from neither.
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME=AUTHOR_NAME,
        GIT_AUTHOR_EMAIL=AUTHOR_EMAIL,
        GIT_COMMITTER_NAME=AUTHOR_NAME,
        GIT_COMMITTER_EMAIL=AUTHOR_EMAIL,
    )
    env.update(extra_env or {})
    completed = subprocess.run(["git", *args], cwd=path, env=env, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise TemplateRepoError(f"git {args[0]} failed in {path}: {completed.stderr.strip()}")
    return completed.stdout
