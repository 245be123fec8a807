"""Reads of template repositories, templates and their versions."""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Min, Q, QuerySet

from app.core.tenancy import SEES_ALL, Viewer
from app.prompts.models import DeployMarker, PrefixFamily, Template, TemplateRepository, TemplateVersion

SHORT_SHA = re.compile(r"[0-9a-fA-F]{7,40}")


def repositories(*, viewer: Viewer = SEES_ALL) -> QuerySet[TemplateRepository]:
    """Every registered repository the viewer sees with its number of templates (``template_count``),
    by name."""
    return (
        viewer.repositories(TemplateRepository.objects.all())
        .annotate(template_count=Count("templates"))
        .order_by("name")
    )


def templates(*, viewer: Viewer = SEES_ALL) -> QuerySet[Template]:
    """Every template the viewer sees with its repository and number of versions (``version_count``),
    by name."""
    return (
        viewer.templates(Template.objects.all())
        .select_related("repository")
        .annotate(version_count=Count("versions"))
    )


def find_template(ident: str, *, viewer: Viewer = SEES_ALL) -> Template | None:
    """The template the viewer sees that `ident` names, by its name or its id (template_named)."""
    return template_named(viewer.templates(Template.objects.all()), ident)


def template_named(templates: QuerySet[Template], ident: str) -> Template | None:
    """The one of `templates` that `ident` names: its name, else (a number no template is named)
    its id; None when neither fits. A template named as another's id is found by its name. Every
    template parameter of the API and the explorer is resolved here."""
    found = templates.filter(name=ident).first() if ident else None  # NUL: PostgreSQL's DataError
    if found is None and ident.isascii() and ident.isdigit() and int(ident) < 2**63:
        found = templates.filter(pk=int(ident)).first()
    return found


def chosen_templates(
    *, viewer: Viewer = SEES_ALL, names: Sequence[str] = (), repository: TemplateRepository | None = None
) -> list[Template]:
    """The templates the viewer sees, with their repository, by name: those `names` names (each a
    name or an id, as template_named reads it; one naming none is left out) when given, of
    `repository` when given."""
    seen = viewer.templates(Template.objects.all()).select_related("repository")
    if repository is not None:
        seen = seen.filter(repository=repository)
    if not names:
        return list(seen.order_by("name"))
    found = {
        template.pk: template for ident in dict.fromkeys(names) if (template := template_named(seen, ident))
    }
    return sorted(found.values(), key=lambda template: template.name)


def versions(template: Template) -> QuerySet[TemplateVersion]:
    """A template's versions, newest commit first, without their content and diff."""
    return template.versions.defer("content", "diff").order_by("-committed_at", "-pk")


def families(*, viewer: Viewer = SEES_ALL) -> QuerySet[PrefixFamily]:
    """Every prefix family the viewer sees with its template and sample's server, most requests first."""
    return (
        viewer.families(PrefixFamily.objects.all())
        .select_related("template", "sample_server")
        .order_by("-requests", "-last_seen_at", "pk")
    )


def find_version(template: Template, name: str) -> TemplateVersion | None:
    """The version of ``template`` that ``name`` names: its full sha (or the name traffic used before
    the import), a tag, or an unambiguous short sha (7 hex digits or more) of an imported version.
    Tried in that order; None when nothing (or more than one short-sha match) fits."""
    if not name:
        return None
    short = name.lower() if SHORT_SHA.fullmatch(name) else None
    wanted = Q(commit_sha=name) | Q(tags__contains=[name])
    if short:
        wanted |= Q(commit_sha=short) | Q(commit_sha__startswith=short, imported_at__isnull=False)
    found = list(template.versions.filter(wanted))
    exact = [v for v in found if v.commit_sha in (name, short)]
    tagged = [v for v in found if name in v.tags]
    if exact or tagged:
        return (exact or tagged)[0]
    return found[0] if len(found) == 1 else None


def version_in_repository(repository: TemplateRepository, sha: str) -> TemplateVersion | None:
    """Any imported version of the repository's templates at this commit."""
    return TemplateVersion.objects.filter(
        template__repository=repository, commit_sha=sha, imported_at__isnull=False
    ).first()


def repository_for_url(url: str) -> TemplateRepository | None:
    """The registered repository a webhook's URL names: the same host and path, whatever the scheme,
    credentials, case of the host, trailing slash or ``.git``."""
    wanted = comparable_url(url)
    if not wanted:
        return None
    return next((r for r in TemplateRepository.objects.all() if comparable_url(r.location) == wanted), None)


def comparable_url(url: str) -> str:
    """host/path of a URL, lower-case host, without credentials, port 443/80, ``.git`` or a trailing
    slash; "" for what is not an http(s) URL."""
    match = re.fullmatch(r"(?i)https?://(?:[^@/]*@)?([^/:]+)(?::(\d+))?(/.*)?", url.strip())
    if not match:
        return ""
    host, port, path = match.group(1).lower(), match.group(2), (match.group(3) or "").rstrip("/")
    path = path.removesuffix(".git").rstrip("/")
    return f"{host}{':' + port if port and port not in ('80', '443') else ''}{path}"


def deploys(
    *, template: str = "", server: str = "", since: datetime | None = None, until: datetime | None = None
) -> QuerySet[DeployMarker]:
    """Deploy markers, latest first, with their version, template and server; `server` names one
    server's markers and the fleet-wide ones (those apply to it too)."""
    found = DeployMarker.objects.select_related("template_version__template", "server").order_by(
        "-deployed_at", "-pk"
    )
    if template:
        found = found.filter(template_version__template__name=template)
    if server:
        found = found.filter(Q(server__name=server) | Q(server__isnull=True))
    if since is not None:
        found = found.filter(deployed_at__gte=since)
    if until is not None:
        found = found.filter(deployed_at__lt=until)
    return found


@dataclass(frozen=True, slots=True)
class LiveVersion:
    """A version of a template and when it went live: its first deploy marker, else the first request
    that named it; None when neither is known (committed, never seen serving)."""

    version: TemplateVersion
    live_at: datetime | None
    source: str  # "deploy", "first request" or ""


def live_versions(template_id: int) -> list[LiveVersion]:
    """The template's versions, the latest live first (those never live last, newest commit first)."""
    versions = TemplateVersion.objects.filter(template_id=template_id).annotate(
        deployed=Min("deploys__deployed_at", filter=Q(deploys__source="api"))
    )
    found = []
    for version in versions.defer("content"):
        if version.deployed is not None:
            found.append(LiveVersion(version, version.deployed, "deploy"))
        else:
            source = "first request" if version.first_seen_at else ""
            found.append(LiveVersion(version, version.first_seen_at, source))
    never = [v for v in found if v.live_at is None]
    live = sorted((v for v in found if v.live_at is not None), key=lambda v: v.live_at, reverse=True)  # type: ignore[arg-type, return-value]
    return live + never
