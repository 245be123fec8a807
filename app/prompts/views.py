from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from app.core.http import HtmxHttpRequest
from app.prompts import git, selectors, services, tasks
from app.prompts.forms import RepositoryForm
from app.prompts.models import TemplateRepository

PAGE = "prompts/repositories.html"
POLLED = (TemplateRepository.State.QUEUED, TemplateRepository.State.RUNNING)  # the list refreshes itself


@login_required
@require_http_methods(["GET", "POST"])
def repositories(request: HtmxHttpRequest) -> HttpResponse:
    """The template repositories with their import progress; htmx polls get the #repository-list
    partial. Staff register one with the form (its first import is queued at once)."""
    form = RepositoryForm(request.POST) if request.method == "POST" else RepositoryForm()
    if request.method == "POST":
        if not request.user.is_staff:
            raise PermissionDenied
        if form.is_valid():
            try:
                repository = services.register_repository(**form.cleaned_data)
            except (ValueError, services.RepositoryConflict) as exc:
                form.add_error(None, str(exc))
            else:
                _queue(request, repository)
                return redirect("prompts:repositories")
    template = PAGE + ("#repository-list" if request.htmx else "")
    return render(request, template, _context(form))


@login_required
@require_POST
def import_now(request: HtmxHttpRequest, repository_id: int) -> HttpResponse:
    """Staff queue an import of one repository; the page (or, for htmx, the list) follows it."""
    if not request.user.is_staff:
        raise PermissionDenied
    _queue(request, get_object_or_404(TemplateRepository, pk=repository_id))
    if request.htmx:
        return render(request, PAGE + "#repository-list", _context(RepositoryForm()))
    return redirect("prompts:repositories")


def _queue(request: HtmxHttpRequest, repository: TemplateRepository) -> None:
    if tasks.queue_import(repository.pk):
        messages.success(request, f"{repository.name}: import queued.")
    else:
        messages.error(
            request, f"{repository.name}: the task queue is unavailable; the schedule imports it later."
        )


@dataclass(frozen=True, slots=True)
class RepositoryRow:
    repository: TemplateRepository
    location: str  # without a URL's credentials
    percent: int | None  # of the commits the last import had to read, None before it counted them


def _context(form: RepositoryForm) -> dict[str, object]:
    rows = [
        RepositoryRow(
            r,
            git.redacted(r.location),
            100 * r.commits_imported // r.commits_total if r.commits_total else None,
        )
        for r in selectors.repositories()
    ]
    return {"rows": rows, "polling": any(row.repository.state in POLLED for row in rows), "form": form}
