"""The writers of template repositories, templates, their versions and deploy markers.

The import of a repository's history is app/prompts/history.py; this module holds what traffic, the
API and the import share: a version named in traffic, two versions found to be one, a deploy.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec
from django.db import IntegrityError, connection, transaction

from app.domain.templatecheck.check import Result
from app.domain.templatecheck.findings import Finding, Rule
from app.domain.templatecheck.price import Predicted
from app.prompts import git, selectors
from app.prompts.models import (
    DeployMarker,
    PrefixFamily,
    Template,
    TemplateRepository,
    TemplateVersion,
    VersionCheck,
)

logger = logging.getLogger(__name__)

SEEN_MESSAGE = "seen in traffic before its commit was imported"
CHECK_ERROR_MAX = 2000
PRICE_FIELDS = (
    "requests_per_hour", "reused_tokens_before", "reused_tokens_after", "predicted_tokens_per_hour",
    "predicted_gpu_seconds_per_hour", "predicted_cost_per_hour",
)  # fmt: skip


class RepositoryConflict(Exception):
    """Another repository has that name or location."""


class VersionNotFound(Exception):
    """The deploy names a template or version Prefixscope does not know."""


def template_version_seen(
    *, template: str, version: str, tenant: str, seen_at: datetime
) -> tuple[Template | None, TemplateVersion | None]:
    """The template named in traffic, and its version; made when first seen.

    ``version`` may be a full or short sha or a tag: it is the imported version it names when there
    is one (selectors.find_version). Otherwise a version of that name is recorded as committed when
    first seen, until the repository's import gives its real time, author and message (and merges it
    into the imported version, for a short sha or a tag). The first time traffic names a version, a
    deploy marker at ``seen_at`` is recorded, once per version.
    """
    if not template:
        return None, None
    found, _ = Template.objects.get_or_create(name=template, defaults={"tenant": tenant})
    if not version:
        return found, None
    seen = selectors.find_version(found, version)
    if seen is None:
        name = version.lower() if selectors.SHORT_SHA.fullmatch(version) else version
        seen, _ = TemplateVersion.objects.get_or_create(
            template=found, commit_sha=name, defaults={"committed_at": seen_at, "message": SEEN_MESSAGE}
        )
    if seen.first_seen_at is None:
        _first_seen(seen, seen_at)
    return found, seen


def _first_seen(version: TemplateVersion, seen_at: datetime) -> None:
    # The conditional update takes the row lock: of two batches naming a new version at once, one
    # records the marker.
    if TemplateVersion.objects.filter(pk=version.pk, first_seen_at__isnull=True).update(
        first_seen_at=seen_at
    ):
        DeployMarker.objects.create(
            template_version=version, deployed_at=seen_at, source=DeployMarker.Source.TRAFFIC,
            note="the first request naming this version",
        )  # fmt: skip
    version.first_seen_at = seen_at


@dataclass(frozen=True, slots=True)
class FamilySighting:
    """The requests of one ingested batch in one prefix family: its identity (model, block size,
    key), how many, when, and one of them (the sample of a family they make)."""

    model: str
    block_size: int
    key: int  # signed, as request records store hashes
    blocks: int
    first_seen_at: datetime
    last_seen_at: datetime
    requests: int
    sample_server_id: int
    sample_request_id: str


FamilyKey = tuple[str, int, int]  # (model, block size, key): a family's identity
_SIGHTING_COLUMNS = (
    "model varchar, block_size int4, key int8, blocks int2, first_seen_at timestamptz, "
    "last_seen_at timestamptz, requests int4, sample_server_id int8, sample_request_id varchar"
)
_FIELDS = ", ".join(FamilySighting.__dataclass_fields__)
# The sightings come as one JSON array: psycopg would quote a list's values one by one, which took
# longer than the statement.
_SEEN_SQL = f"""
INSERT INTO prompts_prefixfamily AS f ({_FIELDS}, name)
SELECT {_FIELDS}, '' FROM json_to_recordset(%s::json) AS s ({_SIGHTING_COLUMNS})
ORDER BY s.model, s.block_size, s.key
ON CONFLICT (model, block_size, key) DO UPDATE SET
  requests = LEAST(f.requests::int8 + EXCLUDED.requests, 2147483647),
  first_seen_at = LEAST(f.first_seen_at, EXCLUDED.first_seen_at),
  last_seen_at = GREATEST(f.last_seen_at, EXCLUDED.last_seen_at)
RETURNING f.model, f.block_size, f.key, f.id, f.template_id
"""


def prefix_families_seen(sightings: Sequence[FamilySighting]) -> dict[FamilyKey, tuple[int, int | None]]:
    """The family of each sighting, as (id, id of the template it is bound to): made when new (its
    sighting's sample and times), else its count and times moved on. One statement for them all.

    Idempotent on redelivery (one family per identity, ever), though a redelivered batch counts its
    requests again. The families are written in their identity's order, so two batches seeing the
    same new families wait for each other and never deadlock: call it outside a transaction that
    holds other locks, as the ingest does for templates. Sightings must have distinct identities.
    """
    if not sightings:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_SEEN_SQL, [msgspec.json.encode(sightings).decode()])
        return {(model, size, key): (pk, template) for model, size, key, pk, template in cursor.fetchall()}


def name_family(family: PrefixFamily, *, name: str, template: Template | None, now: datetime) -> PrefixFamily:
    """Name a prefix family and bind it to ``template`` (None: unbind it). Only requests ingested
    from then on carry the template: records stored before keep theirs. ``bound_at`` moves only when
    the template changes. The ingest's counts are left alone."""
    if (template.pk if template else None) != family.template_id:
        family.template, family.bound_at = template, now if template else None
    family.name = name.strip()
    family.save(update_fields=["name", "template", "bound_at"])
    logger.info("prefix family %s bound to %s", family.pk, template.pk if template else None)
    return family


@transaction.atomic
def merge_versions(*, source: TemplateVersion, into: TemplateVersion) -> None:
    """Make ``source`` (a version traffic named by a short sha or a tag) part of ``into`` (the
    imported version it names), and delete it.

    Everything that points at ``source`` (request records, diagnoses, regressions, deploy markers)
    then points at ``into``; of the two first-seen deploy markers the earlier is kept.
    """
    markers = DeployMarker.objects.filter(
        template_version__in=[source, into], source=DeployMarker.Source.TRAFFIC
    )
    DeployMarker.objects.filter(pk__in=[m.pk for m in markers.order_by("deployed_at")[1:]]).delete()
    # Through the relations Django knows of, not the models themselves: the apps that point at a
    # version (traffic, regressions ...) sit above this one and may not be imported here.
    for relation in TemplateVersion._meta.related_objects:
        if relation.one_to_many:  # a ForeignKey to TemplateVersion, seen from its end
            field = relation.field.name
            relation.related_model._base_manager.filter(**{field: source}).update(**{field: into})
    seen = [t for t in (source.first_seen_at, into.first_seen_at) if t is not None]
    into.first_seen_at = min(seen) if seen else None
    into.save(update_fields=["first_seen_at"])
    logger.info("merged version %s into %s", source, into)
    source.delete()


def record_deploy(
    *, template: str, version: str, server_id: int | None = None, deployed_at: datetime, note: str = ""
) -> DeployMarker:
    """A deploy marker: ``version`` (full or short sha, or tag) of ``template`` live from ``deployed_at``,
    on one server only when ``server_id`` is given. A hex sha not imported yet is recorded as seen, to
    be completed by the import; VersionNotFound for an unknown template or another unknown name."""
    found = Template.objects.filter(name=template).first()
    if found is None:
        raise VersionNotFound(f"no template named {template!r}")
    live = selectors.find_version(found, version)
    if live is None and selectors.SHORT_SHA.fullmatch(version):
        live, _ = TemplateVersion.objects.get_or_create(
            template=found,
            commit_sha=version.lower(),
            defaults={"committed_at": deployed_at, "message": SEEN_MESSAGE},
        )
    if live is None:
        raise VersionNotFound(f"no version {version!r} of {template}")
    return DeployMarker.objects.create(
        template_version=live, server_id=server_id, deployed_at=deployed_at, note=note
    )


def register_repository(
    *, location: str, globs: list[str], branch: str = "", secret: str = "", name: str = ""
) -> TemplateRepository:
    """A new template repository (not imported yet). ``name`` defaults to the location's last part.
    ValueError for a bad location or glob, RepositoryConflict when the name or location is taken."""
    location = _checked(location, globs)
    try:
        with transaction.atomic():
            return TemplateRepository.objects.create(
                name=name or default_name(location), location=location, globs=globs, branch=branch,
                webhook_secret=secret,
            )  # fmt: skip
    except IntegrityError:
        raise RepositoryConflict("a repository with that name or location is registered already") from None


def update_repository(
    repository: TemplateRepository, *, location: str, globs: list[str], branch: str, secret: str | None = None
) -> TemplateRepository:
    """Point a repository at another location, globs or branch (its next import reads the new
    history whole); the secret changes only when one is given. Same errors as register_repository."""
    location = _checked(location, globs)
    if (location, branch) != (repository.location, repository.branch):
        repository.last_imported_sha = ""  # another history: nothing of it is imported yet
    repository.location, repository.globs, repository.branch = location, globs, branch
    if secret is not None:
        repository.webhook_secret = secret
    try:
        with transaction.atomic():
            repository.save()
    except IntegrityError:
        raise RepositoryConflict("another repository has that location") from None
    return repository


def mark_import_queued(*, repository_id: int, queued: bool = True) -> None:
    """Show an import as queued (``queued=False``: not queued after all, the broker being away); a
    running import's state is left alone."""
    State = TemplateRepository.State
    if queued:
        TemplateRepository.objects.filter(pk=repository_id, state__in=[State.IDLE, State.FAILED]).update(
            state=State.QUEUED
        )
    else:
        TemplateRepository.objects.filter(pk=repository_id, state=State.QUEUED).update(state=State.IDLE)


def default_name(location: str) -> str:
    """The last part of a path or URL, without ``.git``: /srv/prompts.git -> prompts."""
    return Path(git.redacted(location).rstrip("/")).name.removesuffix(".git") or "templates"


def _checked(location: str, globs: list[str]) -> str:
    location = location.strip()
    problem = git.location_problem(location)
    if problem:
        raise ValueError(problem)
    if not globs or any(not g.strip() or g.startswith("/") for g in globs):
        raise ValueError("give one glob or more, relative to the repository's root (templates/*.j2)")
    git.path_matcher(globs)  # ValueError for a malformed one
    return location


def record_version_check(
    *,
    version: TemplateVersion,
    base_sha: str,
    checked_at: datetime,
    result: Result | None = None,
    block_size: int | None = None,
    error: str = "",
) -> VersionCheck:
    """Store the check of ``version``: its template's ``result`` in a check of its commit against
    ``base_sha`` (blank: a root commit, compared with nothing: the base fields stay null, as for a
    file new at the commit), or the ``error`` that kept it from running (then ``result`` is None).
    One row per version, written whole: storing the same check again changes nothing. A new check
    is priced again (price_version_check writes the price: cleared here)."""
    fields: dict[str, object] = {
        "base_sha": base_sha, "checked_at": checked_at, "error": error[:CHECK_ERROR_MAX],
        "verdict": VersionCheck.Verdict.ERROR, "block_size": None, "base_stable_tokens": None,
        "head_stable_tokens": None, "base_blocks": None, "head_blocks": None, "departs_at_token": None,
        "departs_line": None, "ends_class": "", "ends_variable": "", "findings": [],
        "priced_at": None, "requests_per_hour": None, "reused_tokens_before": None,
        "reused_tokens_after": None, "predicted_tokens_per_hour": None,
        "predicted_gpu_seconds_per_hour": None, "predicted_cost_per_hour": None,
    }  # fmt: skip
    if result is not None:
        fields |= _checked_fields(result, compared=bool(base_sha)) | {"block_size": block_size}
    check, _ = VersionCheck.objects.update_or_create(version=version, defaults=fields)
    return check


def _checked_fields(result: Result, *, compared: bool) -> dict[str, object]:
    """A result's figures: head's stable prefix and what ends it, base's and the departure when
    the file was there before (``compared``), the findings, and the verdict they make."""
    fields: dict[str, object] = {"findings": [_finding_json(f) for f in result.findings]}
    cannot = next((f for f in result.findings if f.rule == Rule.CANNOT_RENDER), None)
    if cannot is not None:
        return fields | {"verdict": VersionCheck.Verdict.ERROR, "error": cannot.message[:CHECK_ERROR_MAX]}
    failed = any(f.level == "error" for f in result.findings)
    fields["verdict"] = VersionCheck.Verdict.FAILED if failed else VersionCheck.Verdict.PASSED
    if result.head is not None:
        ends = result.head.ends
        fields |= {
            "head_stable_tokens": result.head.stable_tokens, "head_blocks": result.head.reusable_blocks,
            "ends_class": ends.klass.value if ends else "",
            "ends_variable": ((ends.variable or "") if ends else "")[:100],
        }  # fmt: skip
    if compared and result.base is not None and result.change is not None:
        fields |= {
            "base_stable_tokens": result.base.stable_tokens, "base_blocks": result.base.reusable_blocks,
            "departs_at_token": result.change.departs_at, "departs_line": result.change.line,
        }  # fmt: skip
    return fields


def _finding_json(finding: Finding) -> dict[str, object]:
    """A finding as the row keeps it: positions, classes and the message, never prompt text."""
    return {
        "rule": finding.rule.value, "level": finding.level, "line": finding.line, "token": finding.token,
        "variable": finding.variable, "class": finding.klass.value if finding.klass else None,
        "message": finding.message,
    }  # fmt: skip


def price_version_check(*, check: VersionCheck, predicted: Predicted | None, now: datetime) -> VersionCheck:
    """Store a check's price (``predicted`` None: not priced, no traffic or nothing to compare: the
    price fields are null), and when it was priced."""
    check.priced_at = now
    check.requests_per_hour = predicted.requests_per_hour if predicted else None
    check.reused_tokens_before = predicted.reused_before if predicted else None
    check.reused_tokens_after = predicted.reused_after if predicted else None
    check.predicted_tokens_per_hour = predicted.tokens_per_hour if predicted else None
    check.predicted_gpu_seconds_per_hour = predicted.gpu_seconds_per_hour if predicted else None
    check.predicted_cost_per_hour = predicted.money_per_hour if predicted else None
    check.save(update_fields=[*PRICE_FIELDS, "priced_at"])
    return check
