"""Templates and their versions, their cache killers, and deploy markers (the templates' repositories
and the git push webhook: app/api/repositories.py).

Reads: a logged-in user's session or personal API token (app/api/auth.py). Writes: a staff user's
session (with Django's CSRF token as X-CSRFToken) or personal token, or an ingest token. A template's
cache killers come without prompt text unless asked for (``samples=true``) by a user holding
prompts.read_prompt_text.
"""

from datetime import datetime
from typing import Annotated, Any

from django.http import Http404, HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status
from ninja.pagination import paginate
from ninja.params.functions import Path

from app.api.auth import READ_AUTH, READERS, WRITE_AUTH, WRITERS
from app.api.errors import ApiError, error
from app.api.pages import Pages
from app.api.schemas import Instant
from app.api.viewers import caller_viewer
from app.compare.killers import Samples, killer_samples, visible_killers
from app.fleet.models import Server
from app.prompts import killers, selectors, services
from app.prompts.models import CacheKiller, DeployMarker, Template, TemplateVersion

router = Router(tags=["templates"])
# A template in a path or query, as every operation of the API takes one.
TemplateKey = Annotated[str, Path(description="A template's name, or its id")]


class RepositoryRef(Schema):
    id: int
    name: str


class TemplateOut(Schema):
    id: int
    name: str
    path: str
    repository: RepositoryRef | None
    removed_at: datetime | None
    versions: int

    @staticmethod
    def of(template: Template) -> "TemplateOut":
        repository = template.repository
        return TemplateOut(
            id=template.pk, name=template.name, path=template.path, removed_at=template.removed_at,
            repository=RepositoryRef(id=repository.pk, name=repository.name) if repository else None,
            versions=getattr(template, "version_count", 0),
        )  # fmt: skip


class VersionOut(Schema):
    sha: str = Field(description="Full sha once imported; until then the name traffic used")
    author: str
    author_email: str
    committed_at: datetime = Field(description="Until imported: when traffic first named it")
    message: str
    path: str
    tags: list[str]
    imported: bool

    @staticmethod
    def of(version: TemplateVersion) -> dict[str, Any]:
        fields = ("author", "author_email", "committed_at", "message", "path", "tags")
        return {"sha": version.commit_sha, "imported": version.imported_at is not None} | {
            f: getattr(version, f) for f in fields
        }


class VersionDetailOut(VersionOut):
    content: str = Field(description="The template's text at this commit")
    diff: str = Field(description="Unified diff against the file in the commit's first parent")


class DeployIn(Schema):
    template: str = Field(min_length=1, max_length=200)
    version: str = Field(min_length=1, max_length=40, description="Full or short (7+ hex) sha, or a tag")
    server: str | None = Field(None, description="A registered server's name; none: the whole fleet")
    deployed_at: Instant | None = Field(None, description="Default: now")
    note: str = Field("", max_length=500)


class DeployOut(Schema):
    id: int
    template: str
    version: str
    server: str | None
    deployed_at: datetime
    note: str
    source: str


class RequestKeyOut(Schema):
    server: str = Field(description="The server's name")
    request_id: str
    arrived_at: datetime


class KillerOut(Schema):
    salt_hash: str = Field(
        description="sha256 of the cache salt of the requests it was found in; blank: none"
    )
    model: str
    block_size: int
    mode: str = Field(description="tokens (token-exact) or hashes (hash-only mode: block-exact)")
    position_token: int | None = Field(description="The first token where the requests fan out; null: hashes")
    block_index: int = Field(description="The block of the position")
    kind: str = Field(description="timestamp, id, number, reordered_items, json_key_order, whitespace_drift, "
                      "per_user, rotating_examples, varying_text or unclassified (no text)")  # fmt: skip
    suggestion: str
    requests: int = Field(description="Requests sharing the prefix up to the position")
    requests_affected: int = Field(description="Of them, those losing a block or more to it")
    continuations: int = Field(description="Distinct continuations after the position")
    tokens_lost: int = Field(description="Prompt tokens a stable text there would have let them reuse")
    straddle_tokens: int | None = Field(
        description="A divergence just before a block boundary: the tokens of its block before it, "
        "recomputed anyway"
    )
    sample_requests: list[RequestKeyOut] = Field(description="A few requests that vary there")
    samples: list[str] | None = Field(
        description="Prompt text: the varying line of the sample requests. Only with samples=true, for a "
        "logged-in user holding prompts.read_prompt_text, while their token ids are kept; else null"
    )
    samples_missing: str | None = Field(description="Why samples were asked for and are null or empty")


KILLER_FIELDS = (
    "salt_hash", "model", "block_size", "mode", "position_token", "block_index", "kind", "suggestion",
    "requests", "requests_affected", "continuations", "tokens_lost", "straddle_tokens",
)  # fmt: skip


class KillersOut(Schema):
    template: str
    computed_at: datetime | None = Field(description="When they were last searched for; null: not yet")
    window_start: datetime | None
    window_end: datetime | None
    killers: list[KillerOut] = Field(description="Costliest first")


class KillersQuery(Schema):
    samples: bool = Field(False, description="Include the samples' text (prompt text), where the viewer may")


@router.get(
    "/templates",
    auth=READERS,
    response=list[TemplateOut],
    summary="Templates, with their repository",
    description=READ_AUTH,
    url_name="templates",
)
def list_templates(request: HttpRequest) -> Any:
    return [TemplateOut.of(template) for template in selectors.templates(viewer=caller_viewer(request))]


@router.get(
    "/templates/{template}/versions",
    auth=READERS,
    response=list[VersionOut],
    summary="A template's versions, newest commit first",
    description="Without content and diff (see the version itself). " + READ_AUTH,
    url_name="template-versions",
)
@paginate(Pages)
def list_versions(request: HttpRequest, template: TemplateKey) -> Any:
    found = selectors.find_template(template, viewer=caller_viewer(request))
    if found is None:
        raise Http404("no such template")
    return [VersionOut.of(version) for version in selectors.versions(found)]


@router.get(
    "/templates/{template}/versions/{name}",
    auth=READERS,
    response={200: VersionDetailOut, 404: ApiError},
    summary="One version of a template, with its content and diff",
    description="`name`: a full or short (7+ hex digits) sha, or a tag. " + READ_AUTH,
    url_name="template-version",
)
def get_version(request: HttpRequest, template: TemplateKey, name: str) -> Any:
    found = selectors.find_template(template, viewer=caller_viewer(request))
    version = selectors.find_version(found, name) if found else None
    if version is None:
        return error(404, "no such template or version")
    return VersionOut.of(version) | {"content": version.content, "diff": version.diff}


@router.get(
    "/templates/{template}/killers",
    auth=READERS,
    response={200: KillersOut, 404: ApiError},
    summary="A template's cache killers, costliest first",
    description="The token positions (blocks in hash-only mode) where the template's requests of the last "
    "window fan out, each with its class, a suggestion, its cost and a few sample requests; searched again "
    "every five minutes. `samples=true` adds the varying text, for a logged-in user holding the "
    "prompts.read_prompt_text permission (never for an ingest token). " + READ_AUTH,
    url_name="template-killers",
)
def list_killers(request: HttpRequest, query: Query[KillersQuery], template: TemplateKey) -> Any:
    viewer = caller_viewer(request)
    found_template = selectors.find_template(template, viewer=viewer)
    if found_template is None:
        return error(404, "no such template")
    found, seen = visible_killers(list(killers.template_killers(found_template.pk)), viewer=viewer)
    texts: dict[int, Samples] | None = None
    if query.samples and killers.may_read_prompts(request.user):
        texts = killer_samples(found, now=timezone.now(), viewer=viewer)
    missing = "the viewer may not read prompt text" if query.samples and texts is None else None
    names = dict(viewer.servers(Server.objects.all()).values_list("pk", "name"))
    first = found[0] if found else None
    return {
        "template": found_template.name, "computed_at": first.computed_at if first else None,
        "window_start": first.window_start if first else None,
        "window_end": first.window_end if first else None,
        "killers": [killer_out(k, names, texts.get(k.pk) if texts else None, missing, seen) for k in found],
    }  # fmt: skip


def killer_out(
    killer: CacheKiller,
    names: dict[int, str],
    samples: Samples | None,
    missing: str | None,
    seen: set[killers.SampleKey] | None = None,
) -> dict[str, Any]:
    """A killer as KillerOut, listing the sample requests in `seen` (None: all of them)."""
    keys = [killers.SampleKey.of(stored) for stored in killer.samples]
    keys = [key for key in keys if seen is None or key in seen]
    return {f: getattr(killer, f) for f in KILLER_FIELDS} | {
        "sample_requests": [
            {"server": names.get(k.server_id, "?"), "request_id": k.request_id, "arrived_at": k.arrived_at}
            for k in keys
        ],
        "samples": list(samples.texts) if samples else None,
        "samples_missing": (samples.missing or None) if samples else missing,
    }


@router.post(
    "/deploys",
    auth=WRITERS,
    response={201: DeployOut, 404: ApiError},
    summary="Record a deploy marker",
    description="A template version live from `deployed_at` (default now), on one server or the whole "
    "fleet. A hex sha not imported yet is kept and completed by the next import. " + WRITE_AUTH,
    url_name="deploys-post",
)
def record_deploy(request: HttpRequest, body: DeployIn) -> Any:
    servers = caller_viewer(request).servers(Server.objects.all())
    server = servers.filter(name=body.server).first() if body.server else None
    if body.server and server is None:
        return error(404, f"no server named {body.server!r}")
    try:
        marker = services.record_deploy(
            template=body.template, version=body.version, server_id=server.pk if server else None,
            deployed_at=body.deployed_at or timezone.now(), note=body.note,
        )  # fmt: skip
    except services.VersionNotFound as exc:
        return error(404, str(exc))
    return Status(201, _deploy_out(marker, server))


def _deploy_out(marker: DeployMarker, server: Server | None) -> DeployOut:
    version = marker.template_version
    return DeployOut(
        id=marker.pk, template=version.template.name, version=version.commit_sha,
        server=server.name if server else None, deployed_at=marker.deployed_at, note=marker.note,
        source=marker.source,
    )  # fmt: skip
