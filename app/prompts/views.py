from dataclasses import dataclass

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from app.core.http import HtmxHttpRequest
from app.core.tenancy import Viewer, viewer_of
from app.prompts import git, selectors, services, tasks
from app.prompts.forms import FamilyForm, RepositoryForm
from app.prompts.models import PrefixFamily, TemplateRepository

PAGE = "prompts/repositories.html"
FAMILIES_SHOWN = 200  # the rest through GET /api/v1/families
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
    return render(request, template, _context(form, viewer_of(request.user)))


@login_required
@require_POST
def import_now(request: HtmxHttpRequest, repository_id: int) -> HttpResponse:
    """Staff queue an import of one repository; the page (or, for htmx, the list) follows it."""
    if not request.user.is_staff:
        raise PermissionDenied
    viewer = viewer_of(request.user)
    _queue(request, get_object_or_404(selectors.repositories(viewer=viewer), pk=repository_id))
    if request.htmx:
        return render(request, PAGE + "#repository-list", _context(RepositoryForm(), viewer))
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


def _context(form: RepositoryForm, viewer: Viewer) -> dict[str, object]:
    rows = [
        RepositoryRow(
            r,
            git.redacted(r.location),
            100 * r.commits_imported // r.commits_total if r.commits_total else None,
        )
        for r in selectors.repositories(viewer=viewer)
    ]
    return {"rows": rows, "polling": any(row.repository.state in POLLED for row in rows), "form": form}


@dataclass(frozen=True, slots=True)
class FamilyRow:
    family: PrefixFamily
    key: str  # the wire hash, hex (stored signed)
    tokens: int  # the leading tokens the key covers


@login_required
def families(request: HtmxHttpRequest) -> HttpResponse:
    """The prefix families with the most requests, each with a link to one of its requests."""
    rows = [
        FamilyRow(f, f"{f.key % 2**64:016x}", f.blocks * f.block_size)
        for f in selectors.families(viewer=viewer_of(request.user))[:FAMILIES_SHOWN]
    ]
    context = {"rows": rows, "limit": FAMILIES_SHOWN, "blocks": settings.PREFIXSCOPE_FAMILY_BLOCKS}
    return render(request, "prompts/families.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def family(request: HtmxHttpRequest, family_id: int) -> HttpResponse:
    """One prefix family; staff name it and bind it to a template (later requests carry it)."""
    viewer = viewer_of(request.user)
    found = get_object_or_404(selectors.families(viewer=viewer), pk=family_id)
    data = request.POST if request.method == "POST" else None
    form = FamilyForm(data, initial={"name": found.name, "template": found.template}, viewer=viewer)
    if request.method == "POST":
        if not request.user.is_staff:
            raise PermissionDenied
        if form.is_valid():
            template = form.cleaned_data["template"]
            services.name_family(found, name=form.cleaned_data["name"], template=template, now=timezone.now())
            bound = f"requests from now on carry {template}" if template else "not bound"
            messages.success(request, f"{found}: saved, {bound}.")
            return redirect("prompts:families")
    return render(request, "prompts/family.html", {"family": found, "form": form})
