"""The writer of imported template history: a repository's commits become template versions.

Every commit of the followed ref that changes a file matching the repository's globs is a version
of that file's template, with its sha, author, commit time (the committer's, with its offset),
message, the file's text and its diff against the commit's first parent. Re-importing reads only
the commits after the last imported one (all of them when that one is gone: history rewritten or
the location changed), and writing a version is idempotent.

Files that move or go:
- a rename (git's similarity detection) keeps the template, its name and its versions; the template's
  path becomes the new one, and the rename commit is a version (its diff from the old path);
- a deleted file (or one renamed out of the globs) keeps its template and versions; the template is
  marked removed at that commit, which is no version. A file added again at that path, or renamed
  onto it, continues that template (and the template it was renamed from is removed);
- a file renamed into the globs, or a copy, is a new template.
A new template is named after its file's stem (templates/support.j2 -> support). A template of that
name that traffic used before any import is adopted; one of another file keeps it, and the new one
is named ``<repository>:<path>``.

After the walk, tags are set on the version of each template in effect at the tagged commit, and
versions traffic named before their commit was imported are completed: a full sha gets its commit's
time, author, message and the file's text then (a commit that did not touch the file too), and a
short sha or a tag is merged into the version it names.

Then each imported version not checked yet is checked (app/prompts/version_checks.py) and, once the
import is done, their pricing is queued.
"""

import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from dulwich.repo import Repo

from app.prompts import git, services, version_checks
from app.prompts.models import Template, TemplateRepository, TemplateVersion

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (commits read, commits to read)
PROGRESS_EVERY = 20  # commits between two progress writes to the repository row
IMPORT_LOCK_SPACE = 0x5450_4C31  # pg_try_advisory_lock's first key: a repository's import
ERROR_MAX = 2000
UNEXPECTED = "the import stopped unexpectedly (the worker's log says why)"


class ImportBusy(Exception):
    """Another import of this repository is running."""


@dataclass(frozen=True, slots=True)
class ImportOutcome:
    """What an import did; ``error`` is "" when it succeeded."""

    commits: int = 0
    versions: int = 0
    error: str = ""
    checked: tuple[int, ...] = ()  # the versions checked (their ids)


def import_template_history(
    *, repository_id: int, now: datetime, progress: Progress | None = None
) -> ImportOutcome:
    """Import the repository's new commits, writing progress (commits read / to read) to its row
    as it goes and calling ``progress`` with it. The row ends ``idle`` with the head imported, or
    ``failed`` with the error (the outcome's too) when git or the network failed; an unexpected
    error leaves it ``failed`` and is raised. ImportBusy while another import of it runs."""
    with _import_lock(repository_id) as locked:
        if not locked:
            raise ImportBusy(f"repository {repository_id} is being imported")
        repository = TemplateRepository.objects.get(pk=repository_id)
        _write_state(repository, state=TemplateRepository.State.RUNNING, import_started_at=now,
                     commits_imported=0, commits_total=0, last_error="")  # fmt: skip
        try:
            outcome = _import(repository, now=now, progress=progress)
        except git.RepositoryError as exc:
            outcome = ImportOutcome(error=str(exc)[:ERROR_MAX])
        except BaseException:  # a bug, the database, Ctrl-C: the row must not stay "running"
            _write_state(repository, state=TemplateRepository.State.FAILED, last_error=UNEXPECTED)
            raise
        state = TemplateRepository.State.FAILED if outcome.error else TemplateRepository.State.IDLE
        _write_state(repository, state=state, last_error=outcome.error)
    version_checks.queue_pricing(list(outcome.checked))
    if outcome.error:
        logger.warning("import of template repository %s failed: %s", repository.name, outcome.error)
    else:
        logger.info(
            "imported %d commits of %s: %d versions", outcome.commits, repository.name, outcome.versions
        )
    return outcome


@contextmanager
def _import_lock(repository_id: int) -> Iterator[bool]:
    """A session advisory lock on the repository: released even when the worker's transaction is not."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [IMPORT_LOCK_SPACE, repository_id])
        locked = bool(cursor.fetchone()[0])
    try:
        yield locked
    finally:
        if locked:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [IMPORT_LOCK_SPACE, repository_id])


def _write_state(repository: TemplateRepository, **changes: object) -> None:
    TemplateRepository.objects.filter(pk=repository.pk).update(**changes)
    for field, value in changes.items():
        setattr(repository, field, value)


def _import(repository: TemplateRepository, *, now: datetime, progress: Progress | None) -> ImportOutcome:
    cache = Path(settings.PREFIXSCOPE_TEMPLATE_CACHE_DIR) / f"{repository.pk}.git"
    with git.opened(repository.location, cache=cache) as repo:
        head = git.head(repo, repository.branch)
        commits = git.commits_since(repo, head, repository.last_imported_sha)
        _write_state(repository, commits_total=len(commits))
        versions = _walk(repository, repo, commits, now=now, progress=progress)
        tagged = git.tags(repo)
        _set_tags(repository, repo, tagged)
        _complete_seen_versions(repository, repo, tagged, now=now)
        checked = version_checks.check_new_versions(repository, repo, now=now)
    _write_state(repository, last_imported_sha=head, last_imported_at=now)
    return ImportOutcome(commits=len(commits), versions=versions, checked=tuple(checked))


def _walk(
    repository: TemplateRepository,
    repo: Repo,
    commits: list[str],
    *,
    now: datetime,
    progress: Progress | None,
) -> int:
    """Write the versions of ``commits`` (parents first), one transaction a commit; their number."""
    matches = git.path_matcher(repository.globs)
    written = 0
    for done, sha in enumerate(commits, start=1):
        info = git.read_commit(repo, sha, matches)
        if info.changes:
            with transaction.atomic():
                written += sum(_apply(repository, info, change, now=now) for change in info.changes)
        if done % PROGRESS_EVERY == 0 or done == len(commits):
            _write_state(repository, commits_imported=done)
            if progress is not None:
                progress(done, len(commits))
    return written


def _apply(
    repository: TemplateRepository, info: git.CommitInfo, change: git.FileChange, *, now: datetime
) -> bool:
    """Write one file's change; True when it is a version (a deletion is none)."""
    if not change.path:
        Template.objects.filter(repository=repository, path=change.old_path).update(
            removed_at=info.committed_at
        )
        return False
    moved = _at_path(repository, change.old_path) if change.old_path != change.path else None
    template = _at_path(repository, change.path) or moved or _new_template(repository, change.path)
    if moved is not None and moved != template:
        Template.objects.filter(pk=moved.pk).update(removed_at=info.committed_at)
    if (template.path, template.removed_at) != (change.path, None):
        Template.objects.filter(pk=template.pk).update(path=change.path, removed_at=None)
    _write_version(template, info, change, now=now)
    return True


def _at_path(repository: TemplateRepository, path: str) -> Template | None:
    return Template.objects.filter(repository=repository, path=path).first() if path else None


def _new_template(repository: TemplateRepository, path: str) -> Template:
    """The template of a file new to the repository: its stem's name, or a traffic-seen template of
    that name adopted, or ``<repository>:<path>`` when another file has the name."""
    stem = PurePosixPath(path).stem or path
    for name in (stem, f"{repository.name}:{path}"[:200]):
        existing = Template.objects.filter(name=name).first()
        if existing is None:
            return Template.objects.create(name=name, repository=repository, path=path)
        if existing.repository_id is None:
            Template.objects.filter(pk=existing.pk).update(repository=repository, path=path)
            existing.repository, existing.path = repository, path
            return existing
    return Template.objects.create(name=f"{repository.pk}:{path}"[:200], repository=repository, path=path)


def _write_version(
    template: Template, info: git.CommitInfo, change: git.FileChange, *, now: datetime
) -> TemplateVersion:
    version, _ = TemplateVersion.objects.update_or_create(
        template=template,
        commit_sha=info.sha,
        defaults={
            "committed_at": info.committed_at, "author": info.author[:200],
            "author_email": info.author_email[:200], "message": info.message, "path": change.path,
            "content": change.content, "diff": change.diff, "imported_at": now,
        },
    )  # fmt: skip
    return version


def _set_tags(repository: TemplateRepository, repo: Repo, tagged: dict[str, str]) -> None:
    """Each tag on the version of each template in effect at the tagged commit (the last commit at
    or before it that changed the file); tags gone or moved are taken off."""
    templates = list(repository.templates.exclude(path=""))
    wanted: dict[int, list[str]] = defaultdict(list)
    for tag, commit in tagged.items():
        for template in templates:
            sha = git.last_change(repo, commit, template.path)
            version = template.versions.filter(commit_sha=sha).first() if sha else None
            if version is not None:
                wanted[version.pk].append(tag)
    versions = TemplateVersion.objects.filter(template__repository=repository)
    for version in versions.filter(~Q(tags=[]) | Q(pk__in=wanted)):
        tags = sorted(wanted.get(version.pk, []))
        if version.tags != tags:
            TemplateVersion.objects.filter(pk=version.pk).update(tags=tags)


def _complete_seen_versions(
    repository: TemplateRepository, repo: Repo, tagged: dict[str, str], *, now: datetime
) -> None:
    """Complete (or merge into the imported one) each version traffic named that the repository has."""
    seen = TemplateVersion.objects.filter(template__repository=repository, imported_at__isnull=True)
    for version in seen.select_related("template"):
        if version.commit_sha in tagged:
            target = version.template.versions.filter(tags__contains=[version.commit_sha]).first()
        else:
            target = _version_at_commit(repo, version, now=now)
        if target is not None and target.pk != version.pk:
            services.merge_versions(source=version, into=target)


def _version_at_commit(repo: Repo, version: TemplateVersion, *, now: datetime) -> TemplateVersion | None:
    """The imported version at the commit a seen version's sha names, written from the file at that
    commit when the walk made none (a commit that did not touch the file); None when the repository
    has no such commit or no such file then."""
    sha = git.find_commit(repo, version.commit_sha)
    if sha is None:
        return None
    imported = version.template.versions.filter(commit_sha=sha, imported_at__isnull=False).first()
    if imported is not None:
        return imported
    info = git.file_at(repo, sha, version.template.path)
    return _write_version(version.template, info, info.changes[0], now=now) if info else None
