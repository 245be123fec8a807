"""Template repositories: registering one, its import progress, an import now, and the git push webhook.

Reads: a logged-in user's session or personal API token (app/api/auth.py). Writes: a staff user's
session (with Django's CSRF token as X-CSRFToken) or personal token, or an ingest token; an ingest
token registers http(s) URLs only, never a path or file:// URL on the server. The webhook is
authenticated by the repository's shared secret. Webhook secrets are never in an answer.

Paths below /templates/ and the "templates" tag, as before these left app/api/templates.py; so are
the operations' ids (`operation_id`), which clients generated from the schema call.
"""

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from app.api.auth import READ_AUTH, READERS, WRITE_AUTH, WRITERS
from app.api.errors import ApiError, error
from app.api.models import IngestToken
from app.api.viewers import caller_viewer
from app.prompts import git, selectors, services, tasks, webhooks
from app.prompts.models import TemplateRepository

router = Router(tags=["templates"])

WEBHOOK_MAX_BYTES = 25 * 1024 * 1024  # GitHub's cap on a delivery


class RepositoryIn(Schema):
    location: str = Field(
        min_length=1, max_length=1000, description="An absolute path, or an http(s)/file URL"
    )
    globs: list[str] = Field(min_length=1, description="Template files, git wildmatch: templates/*.j2")
    branch: str = Field("", max_length=200, description="Branch or ref to follow; blank: HEAD")
    secret: str = Field("", max_length=200, description="Webhook shared secret; write-only")
    name: str = Field("", max_length=200, description="Default: the location's last part")


class RepositoryOut(Schema):
    id: int
    name: str
    location: str = Field(description="Without the credentials a URL may carry")
    globs: list[str]
    branch: str
    has_webhook_secret: bool
    state: str = Field(description="idle, running or failed")
    commits_imported: int = Field(description="Commits read so far by the last (or running) import")
    commits_total: int = Field(description="Commits that import had to read")
    last_error: str
    last_imported_sha: str
    last_imported_at: datetime | None
    import_started_at: datetime | None

    @staticmethod
    def of(repository: TemplateRepository) -> "RepositoryOut":
        return RepositoryOut(
            id=repository.pk, name=repository.name, location=git.redacted(repository.location),
            globs=repository.globs, branch=repository.branch,
            has_webhook_secret=bool(repository.webhook_secret), state=repository.state,
            commits_imported=repository.commits_imported, commits_total=repository.commits_total,
            last_error=repository.last_error,
            last_imported_sha=repository.last_imported_sha, last_imported_at=repository.last_imported_at,
            import_started_at=repository.import_started_at,
        )  # fmt: skip


class ImportOut(Schema):
    repository: int
    queued: bool


class HookQuery(Schema):
    repository: int | None = Field(None, description="The repository's id, when its URL is not the payload's")


class HookOut(Schema):
    repository: int
    queued: bool
    detail: str


@router.post(
    "/templates/hooks/git",
    auth=None,
    response={200: HookOut, 202: HookOut, 400: ApiError, 401: ApiError, 403: ApiError, 404: ApiError,
              413: ApiError, 503: ApiError},
    summary="Git push webhook (GitHub or GitLab)",
    description="Queues an import of the repository the payload names (repository.clone_url/html_url, "
    "project.git_http_url/web_url) or ?repository=<id> names. GitHub: X-GitHub-Event and "
    "X-Hub-Signature-256 (HMAC-SHA256 of the body with the shared secret). GitLab: X-Gitlab-Event and "
    "X-Gitlab-Token (the secret). 202: queued. 200: an event that is no push (ping): nothing to do. "
    "400: not such a webhook. 401: no signature or token. 403: a wrong one, or the repository has no "
    "secret. 404: no such registered repository.",
    operation_id="app_api_templates_git_hook",
    url_name="templates-git-hook",
)  # fmt: skip
def git_hook(request: HttpRequest, query: Query[HookQuery]) -> Any:
    body = request.read(WEBHOOK_MAX_BYTES + 1)
    if len(body) > WEBHOOK_MAX_BYTES:
        return error(413, f"body larger than {WEBHOOK_MAX_BYTES} bytes")
    try:
        delivery = webhooks.parse_delivery(request.headers, body)
    except webhooks.MalformedHook as exc:
        return error(400, str(exc))
    repository = _hooked_repository(query.repository, delivery)
    if repository is None:
        return error(404, "no registered repository has the payload's URL (or that id)")
    problem = webhooks.secret_problem(delivery, request.headers, body, repository.webhook_secret)
    if problem is not None:
        return error(problem[0], problem[1])
    if not delivery.is_push:
        return Status(
            200, {"repository": repository.pk, "queued": False, "detail": f"{delivery.event}: ignored"}
        )
    if not tasks.queue_import(repository.pk):
        return error(503, "the task queue is unavailable; retry later")
    return Status(202, {"repository": repository.pk, "queued": True, "detail": "import queued"})


def _hooked_repository(repository_id: int | None, delivery: webhooks.Delivery) -> TemplateRepository | None:
    if repository_id is not None:
        return TemplateRepository.objects.filter(pk=repository_id).first()
    return next(filter(None, map(selectors.repository_for_url, delivery.urls)), None)


@router.post(
    "/templates/repositories",
    auth=WRITERS,
    response={201: RepositoryOut, 400: ApiError, 403: ApiError, 409: ApiError},
    summary="Register a template repository",
    description="Registers it and enqueues its first import (or the schedule's, when the task queue is "
    "away). 400: a bad location or glob. 403: a path or file:// URL with an ingest token. 409: the name "
    "or location is registered already. " + WRITE_AUTH,
    operation_id="app_api_templates_register_repository",
    url_name="templates-repositories-post",
)
def register_repository(request: HttpRequest, body: RepositoryIn) -> Any:
    by_token = isinstance(getattr(request, "auth", None), IngestToken)
    if by_token and not body.location.lower().startswith(("http://", "https://")):
        return error(403, "an ingest token registers http(s) URLs only")
    try:
        repository = services.register_repository(
            location=body.location, globs=body.globs, branch=body.branch, secret=body.secret, name=body.name
        )
    except ValueError as exc:
        return error(400, str(exc))
    except services.RepositoryConflict as exc:
        return error(409, str(exc))
    tasks.queue_import(repository.pk)
    return Status(201, RepositoryOut.of(repository))


@router.get(
    "/templates/repositories",
    auth=READERS,
    response=list[RepositoryOut],
    summary="Template repositories, with their import progress",
    description=READ_AUTH,
    operation_id="app_api_templates_list_repositories",
    url_name="templates-repositories",
)
def list_repositories(request: HttpRequest) -> Any:
    return [
        RepositoryOut.of(repository) for repository in selectors.repositories(viewer=caller_viewer(request))
    ]


@router.get(
    "/templates/repositories/{repository_id}",
    auth=READERS,
    response={200: RepositoryOut, 404: ApiError},
    summary="A template repository, with its import progress",
    description=READ_AUTH,
    operation_id="app_api_templates_get_repository",
    url_name="templates-repository",
)
def get_repository(request: HttpRequest, repository_id: int) -> Any:
    repository = selectors.repositories(viewer=caller_viewer(request)).filter(pk=repository_id).first()
    if repository is None:
        return error(404, "no such repository")
    return RepositoryOut.of(repository)


@router.post(
    "/templates/repositories/{repository_id}/import",
    auth=WRITERS,
    response={202: ImportOut, 404: ApiError, 503: ApiError},
    summary="Import a template repository's new commits now",
    description="Enqueues the import; its progress is on the repository. " + WRITE_AUTH,
    operation_id="app_api_templates_import_repository",
    url_name="templates-repository-import",
)
def import_repository(request: HttpRequest, repository_id: int) -> Any:
    repository = selectors.repositories(viewer=caller_viewer(request)).filter(pk=repository_id).first()
    if repository is None:
        return error(404, "no such repository")
    if not tasks.queue_import(repository.pk):
        return error(503, "the task queue is unavailable; retry later")
    return Status(202, {"repository": repository.pk, "queued": True})
