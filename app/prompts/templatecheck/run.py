"""Running a template check on a repository: its files at two commits, its describing file, the served
model's tokenizer, builder commands, and the server's traffic for the price. The judging is pure
(app/domain/templatecheck); this is its shell.

Builder commands (``command`` in the describing file) run only where the caller allows them: in the
repository's own CI, never in the server's import of a repository it was told about.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from dulwich.repo import Repo

from app.domain.templatecheck.analysis import Render, Template
from app.domain.templatecheck.check import Pair, Report, check_pairs
from app.domain.templatecheck.config import (
    CONFIG_FILE,
    CheckConfig,
    ConfigError,
    TemplateEntry,
    parse_config,
    template_name,
)
from app.domain.templatecheck.perturb import Conditions
from app.domain.templatecheck.price import Traffic
from app.domain.templatecheck.render import CheckedTemplate, RenderError, plain
from app.prompts import git
from app.prompts.templatecheck.tokenizers import LoadedTokenizer, load_tokenizer
from app.prompts.templatecheck.traffic import TrafficUnavailable, fetch_traffic

logger = logging.getLogger(__name__)

COMMAND_TIMEOUT_SECONDS = 30
PASSED_THROUGH = ("PATH", "HOME", "VIRTUAL_ENV")
_ANCESTRY = re.compile(r"(.+?)((?:~\d*|\^1?)*)")
_STEP = re.compile(r"~\d*|\^1?")
_FAKETIME = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
)


class CannotCheck(Exception):
    """The check could not run (exit status 2): no such commit, a bad describing file, no tokenizer,
    or a server that was required and did not answer."""


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """What to check: a repository (path or URL) between two revisions, and how to price it."""

    location: str
    base: str
    head: str
    now: datetime
    server: str | None = None
    token: str | None = None
    hours: int = 24
    max_cost_per_hour: float | None = None
    require_server: bool = False
    allow_commands: bool = True
    tokenizer: str | None = None  # overrides the describing file's
    # The server's own reading of its traffic (POST /api/v1/templates/check), instead of asking one.
    traffic: Callable[[Sequence[str]], Mapping[str, Traffic]] | None = None
    paths: tuple[str, ...] | None = None  # only these template files (None: every one the globs match)


def run_check(request: CheckRequest, *, cache: Path) -> Report:
    """The report of ``request``'s check. Raises CannotCheck."""
    try:
        with git.opened(request.location, cache=cache) as repo:
            return check_commits(repo, request)
    except git.RepositoryError as exc:
        raise CannotCheck(str(exc)) from None


def check_commits(repo: Repo, request: CheckRequest) -> Report:
    """The report of ``request``'s check on an open repository (its ``location`` is not read).
    Raises CannotCheck."""
    base, head = _commit(repo, request.base), _commit(repo, request.head)
    config = read_config(repo, head)
    tokenizer = _tokenizer(repo, request.tokenizer or config.tokenizer)
    with _tree_folders(repo, (base, head), needed=_uses_commands(config) and request.allow_commands) as trees:
        pairs = _pairs(
            repo, base, head, config, tokenizer, trees, allow_commands=request.allow_commands,
            paths=request.paths,
        )  # fmt: skip
        traffic, pricing = _traffic(request, [pair.name for pair in pairs])
        results = check_pairs(
            pairs, tokenizer, block_size=config.block_size, now=Conditions(request.now),
            traffic=traffic, max_cost_per_hour=request.max_cost_per_hour,
        )  # fmt: skip
    return Report(
        base, head, config.block_size, tokenizer.name, tuple(results), pricing, request.max_cost_per_hour
    )


def read_config(repo: Repo, sha: str) -> CheckConfig:
    """The describing file at a commit. Raises CannotCheck when it is missing or invalid."""
    text = git.text_at(repo, sha, CONFIG_FILE)
    if text is None:
        raise CannotCheck(
            f"{CONFIG_FILE} is not in the repository at {sha[:12]}: docs/template-check.md says what it holds"
        )
    try:
        return parse_config(text)
    except ConfigError as exc:
        raise CannotCheck(str(exc)) from None


def _commit(repo: Repo, name: str) -> str:
    """The commit a sha, branch, tag or HEAD names, with git's ``~N`` and ``^`` (first parents) after
    it: ``HEAD~1``, ``main^``."""
    found = _ANCESTRY.fullmatch(name)
    base, steps = (found[1], found[2]) if found else (name, "")
    sha = git.find_commit(repo, base)
    if sha is None:
        with contextlib.suppress(git.RepositoryError):
            sha = git.head(repo, "" if base == "HEAD" else base)
    for step in _STEP.findall(steps):
        count = int(step[1:] or 1) if step.startswith("~") else 1
        for _ in range(count):
            sha = git.first_parent(repo, sha) if sha is not None else None
    if sha is None:
        raise CannotCheck(f"no commit, branch or tag {name!r} in the repository")
    return sha


def _tokenizer(repo: Repo, name: str) -> LoadedTokenizer:
    """The tokenizer ``name`` names; a relative path is in the repository's work tree (a mirror the
    server fetched has none: there, ``gpt2`` or an absolute path)."""
    root = Path(repo.path) if not repo.bare else None
    try:
        return load_tokenizer(name, root=root)
    except (OSError, ValueError) as exc:
        raise CannotCheck(f"tokenizer {name!r}: {exc}") from None


def _uses_commands(config: CheckConfig) -> bool:
    return any(entry.command for entry in config.templates)


def _pairs(
    repo: Repo, base: str, head: str, config: CheckConfig, tokenizer: LoadedTokenizer,
    trees: Mapping[str, Path], *, allow_commands: bool, paths: Sequence[str] | None = None,
) -> list[Pair]:  # fmt: skip
    """Every file an entry's globs match at base or head (the first entry that matches a file wins),
    of ``paths`` only when given."""
    matched: dict[str, TemplateEntry] = {}
    every = sorted(set(git.paths_at(repo, base)) | set(git.paths_at(repo, head)))
    for entry in config.templates:
        matches = git.path_matcher(entry.files)
        for path in every:
            if matches(path) and path != CONFIG_FILE and (paths is None or path in paths):
                matched.setdefault(path, entry)
    pairs = []
    for path, entry in matched.items():
        name = template_name(entry, path)
        sides = [
            _template(repo, sha, path, name, entry, config, tokenizer, trees, allow_commands)
            for sha in (base, head)
        ]
        golden = entry.golden.replace("{name}", name) if entry.golden else None
        golden_text = git.text_at(repo, head, golden) if golden else None
        pairs.append(Pair(name, path, sides[0], sides[1], golden, golden_text))
    return pairs


def _template(
    repo: Repo, sha: str, path: str, name: str, entry: TemplateEntry, config: CheckConfig,
    tokenizer: LoadedTokenizer,
    trees: Mapping[str, Path], allow_commands: bool,
) -> Template | None:  # fmt: skip
    source = git.text_at(repo, sha, path)
    if source is None:
        return None
    wrap = partial(tokenizer.wrap, user=entry.user) if entry.kind == "chat" else _as_is
    if entry.command:
        if not allow_commands:
            return Template(name, path, source, entry, _refused, wrap, command=True)
        return Template(
            name, path, source, entry, _command_render(entry.command, trees[sha]), wrap, command=True
        )
    return Template(name, path, source, entry, _jinja_render(source, config, path), wrap)


def _as_is(text: str, context: Mapping[str, Any]) -> str:
    return text


def _jinja_render(source: str, config: CheckConfig, path: str) -> Render:
    try:
        template = CheckedTemplate(source, config.jinja, name=path)
    except RenderError as exc:
        message = str(exc)

        def broken(context: Mapping[str, Any], conditions: Conditions) -> Any:
            raise RenderError(message)

        return broken
    return template.render


def _refused(context: Mapping[str, Any], conditions: Conditions) -> Any:
    raise RenderError("builder commands run only in the repository's own CI (manage.py check_templates)")


def _command_render(command: Sequence[str], root: Path) -> Render:
    """Run the builder with the sample as JSON on stdin; its stdout is the prompt. The conditions
    reach it through its environment (and the wall clock through libfaketime, where installed)."""

    def render(context: Mapping[str, Any], conditions: Conditions) -> Any:
        done = subprocess.run(
            list(command), input=json.dumps(dict(context)), cwd=root, env=_command_environment(conditions),
            capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1][:300]
            raise RenderError(f"{' '.join(command)} exited with status {done.returncode}: {last}")
        return plain(done.stdout)

    return render


def _command_environment(conditions: Conditions) -> dict[str, str]:
    # Only what finds the builder's interpreter passes through (not settings: the builder's own
    # environment is the conditions below), so that nothing else of this process reaches it.
    environment = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
    environment |= {
        "TZ": conditions.zone, "LC_ALL": conditions.locale, "LANG": conditions.locale,
        "PYTHONHASHSEED": str(conditions.hash_seed), "PREFIXSCOPE_CHECK_SEED": str(conditions.seed),
        "PREFIXSCOPE_CHECK_NOW": conditions.now.isoformat(),
    }  # fmt: skip
    library = next((path for path in _FAKETIME if Path(path).exists()), None)
    if library is not None:
        environment |= {"LD_PRELOAD": library, "FAKETIME": "@" + conditions.now.strftime("%Y-%m-%d %H:%M:%S")}
    return environment


@contextlib.contextmanager
def _tree_folders(repo: Repo, shas: Sequence[str], *, needed: bool) -> Iterator[dict[str, Path]]:
    """Each commit's files written out in a temporary folder, for builder commands to run in."""
    if not needed:
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="prefixscope-check-") as folder:
        trees = {}
        for sha in dict.fromkeys(shas):
            root = Path(folder) / sha
            for path in git.paths_at(repo, sha):
                target = root / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(git.bytes_at(repo, sha, path) or b"")
            trees[sha] = root
        yield trees


def _traffic(request: CheckRequest, names: list[str]) -> tuple[Mapping[str, Traffic] | None, str]:
    if request.traffic is not None:
        return request.traffic(names), f"priced with the server's last {request.hours} h of traffic"
    if not request.server:
        return None, "not priced (no --server)"
    try:
        found = fetch_traffic(request.server, request.token, names=names, hours=request.hours)
    except TrafficUnavailable as exc:
        if request.require_server:
            raise CannotCheck(f"the server did not answer: {exc}") from None
        logger.warning("the check goes on without prices: %s", exc)
        return None, f"not priced ({exc})"
    return found, f"priced with the last {request.hours} h of traffic on {request.server}"
