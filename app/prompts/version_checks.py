"""The template check of each imported version (docs/template-check.md), made by the import: the
version's file at its commit against the same file at the commit's first parent, stored on the
version (VersionCheck) with the findings of that file only. The price comes after, from the
template's traffic (app/diagnosis/template_traffic.py, queued by name: that layer reads the rollups).

The server never runs repository code: builder commands are refused (their templates' checks say
they could not render). A repository without the describing file gets a check of verdict "error"
with the reason, one per version, so the template page can say why there is no prediction rather
than show nothing; a version's check is made once (a re-import checks only versions without one,
and those whose check stopped on a fault of the check itself).
"""

import logging
from collections import defaultdict
from datetime import datetime

from celery import current_app
from django.db import transaction
from django.db.models import Q
from dulwich.repo import Repo
from kombu.exceptions import OperationalError as BrokerUnavailable

from app.prompts import git, services
from app.prompts.models import TemplateRepository, TemplateVersion
from app.prompts.templatecheck.run import CannotCheck, CheckRequest, check_commits

logger = logging.getLogger(__name__)

PRICE_TASK = "diagnosis.price_version_checks"  # app/diagnosis/tasks.py
NOT_DESCRIBED = "{path} is matched by none of prefixscope.yaml's templates: not checked"
UNEXPECTED = "the check stopped unexpectedly (the worker's log says why)"


def check_new_versions(repository: TemplateRepository, repo: Repo, *, now: datetime) -> list[int]:
    """Check every imported version of ``repository`` that has no check yet, or whose check stopped
    unexpectedly (tried again at each import), one check a commit (of the files it changed); the ids
    of the versions checked."""
    unchecked = (
        TemplateVersion.objects.filter(template__repository=repository, imported_at__isnull=False)
        .filter(Q(template_check__isnull=True) | Q(template_check__error=UNEXPECTED))
        .exclude(path="")
    )
    by_commit: dict[str, list[TemplateVersion]] = defaultdict(list)
    for version in unchecked.only("pk", "commit_sha", "path").order_by("committed_at", "pk"):
        by_commit[version.commit_sha].append(version)
    for sha, versions in by_commit.items():
        _check_commit(repo, sha, versions, now=now)
    return [version.pk for versions in by_commit.values() for version in versions]


def _check_commit(repo: Repo, sha: str, versions: list[TemplateVersion], *, now: datetime) -> None:
    """One commit's versions checked against its first parent (a root commit against itself, its
    base figures then left out)."""
    parent = git.first_parent(repo, sha)
    request = CheckRequest(
        location="", base=parent or sha, head=sha, now=now, allow_commands=False,
        paths=tuple(version.path for version in versions),
    )  # fmt: skip
    base_sha = parent or ""
    try:
        report = check_commits(repo, request)
    except CannotCheck as exc:
        _record_errors(versions, base_sha, str(exc), now=now)
        return
    except Exception:  # a bug in the check must not stop the import of the history
        logger.exception("the check of commit %s failed", sha[:12])
        _record_errors(versions, base_sha, UNEXPECTED, now=now)
        return
    results = {result.path: result for result in report.results}
    for version in versions:
        result = results.get(version.path)
        services.record_version_check(
            version=version, base_sha=base_sha, checked_at=now, result=result,
            block_size=report.block_size, error="" if result else NOT_DESCRIBED.format(path=version.path),
        )  # fmt: skip


def _record_errors(versions: list[TemplateVersion], base_sha: str, error: str, *, now: datetime) -> None:
    for version in versions:
        services.record_version_check(version=version, base_sha=base_sha, checked_at=now, error=error)


def queue_pricing(version_ids: list[int]) -> None:
    """Queue the price of these versions' checks once the transaction in progress commits (at once
    outside one). By the task's name: it lives in a layer above this one. A broker that is away
    leaves them unpriced (logged)."""
    if version_ids:
        transaction.on_commit(lambda: _enqueue(version_ids), robust=True)


def _enqueue(version_ids: list[int]) -> None:
    # A signature runs the task registered in this process (eager in tests), else sends it by name.
    pricing = current_app.signature(PRICE_TASK, args=(version_ids,))
    try:
        pricing.apply_async(retry=False)
    except BrokerUnavailable:
        logger.warning("%d version checks not priced: the broker is away", len(version_ids))
