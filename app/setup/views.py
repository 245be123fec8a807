"""The set-up pages: servers (register, edit, disable, accept or merge the proposed ones), ingest
tokens and each user's personal API tokens; template repositories are app/prompts' page. Anyone
logged in reads them; staff change them (a user's own tokens are theirs to change). Every change is
a service's (app/fleet, app/traffic, app/api).

A token's secret is in the one answer to the POST that created it: rendered there, never redirected
through the session or messages, never cached, never logged."""

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from app.api import services as tokens
from app.api.models import IngestToken, PersonalToken
from app.core.http import HtmxHttpRequest
from app.core.tenancy import Viewer, viewer_of
from app.dashboard.forms import ProposedServerForm
from app.fleet import selectors as fleet_selectors
from app.fleet import services as fleet
from app.fleet.models import Server
from app.prompts import git
from app.prompts import services as prompts
from app.prompts.models import TemplateRepository
from app.rollups.merge import merge_server
from app.setup.forms import EndpointsForm, RepositoryEditForm, ServerForm, TokenForm

SERVERS = "setup/servers.html"


@login_required
@require_http_methods(["GET", "POST"])
def servers(request: HtmxHttpRequest) -> HttpResponse:
    """Every server with its state; staff register one with the form."""
    form = ServerForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        _staff_only(request)
        if form.is_valid():
            try:
                server = fleet.create_server(**form.cleaned_data)
            except fleet.NameTaken as exc:
                form.add_error("name", str(exc))
            else:
                messages.success(request, f"{server.name} is registered: its /metrics pulls begin.")
                return redirect("setup:servers")
    return render(request, SERVERS, _servers(form, viewer=viewer_of(request.user)))


@login_required
@require_http_methods(["GET", "POST"])
def server(request: HtmxHttpRequest, server_id: int) -> HttpResponse:
    """One registered server's endpoints; staff change them, or disable or enable it."""
    seen = viewer_of(request.user).servers(Server.objects.exclude(state=Server.State.PROPOSED))
    found = get_object_or_404(seen, pk=server_id)
    form = EndpointsForm(request.POST if request.method == "POST" else None, initial=_endpoints(found))
    if request.method == "POST":
        _staff_only(request)
        if form.is_valid():
            try:
                fleet.update_server(server_id=found.pk, **form.cleaned_data)
            except fleet.ServerStateError as exc:
                messages.error(request, str(exc))
            else:
                messages.success(request, f"{found.name}: saved.")
            return redirect("setup:servers")
    return render(request, "setup/server.html", {"server": found, "form": form})


@login_required
@require_POST
def server_enabled(request: HtmxHttpRequest, server_id: int) -> HttpResponse:
    """Staff disable a server (its pulls stop, its data stays) or enable it again."""
    _staff_only(request)
    _seen_server(request, server_id)
    enable = request.POST.get("enabled") == "true"
    try:
        changed = fleet.set_server_enabled(server_id=server_id, enabled=enable)
        messages.success(request, f"{changed.name} is {changed.get_state_display().lower()}.")
    except fleet.ServerStateError as exc:
        messages.error(request, str(exc))
    return _server_list(request)


@login_required
@require_POST
def proposed(request: HtmxHttpRequest, server_id: int) -> HttpResponse:
    """Staff accept a proposed server at its base URL, or merge it into a registered one."""
    _staff_only(request)
    _seen_server(request, server_id)
    form = ProposedServerForm(request.POST, auto_id=f"proposed-{server_id}-%s")
    if not form.is_valid():
        return _server_list(request, invalid={server_id: form})
    data = form.cleaned_data
    try:
        if data["action"] == "accept":
            accepted = fleet.accept_server(server_id=server_id, base_url=data["base_url"])
            messages.success(request, f"{accepted.name} is registered: its /metrics pulls begin.")
        else:
            merged = merge_server(server_id=server_id, into_id=data["into"].pk)
            messages.success(
                request,
                f"Merged into {data['into']}: {merged.moved} request records moved, {merged.joined} joined.",
            )
    except fleet.ServerStateError as exc:  # accepted, merged or deleted by someone else meanwhile
        messages.error(request, str(exc))
    return _server_list(request)


def _server_list(
    request: HtmxHttpRequest, *, invalid: dict[int, ProposedServerForm] | None = None
) -> HttpResponse:
    """The page again (a redirect, or for htmx its #server-list); a proposed server's invalid form
    with its errors."""
    if invalid is None and not request.htmx:
        return redirect("setup:servers")
    template = SERVERS + ("#server-list" if request.htmx else "")
    return render(request, template, _servers(ServerForm(), invalid=invalid, viewer=viewer_of(request.user)))


def _seen_server(request: HtmxHttpRequest, server_id: int) -> None:
    """404 for a server the user does not see (app/core/tenancy.py): staff of one tenant change its
    servers alone, and learn nothing of the others'."""
    if not viewer_of(request.user).servers(Server.objects.filter(pk=server_id)).exists():
        raise Http404("no such server")


def _servers(
    form: ServerForm, *, viewer: Viewer, invalid: dict[int, ProposedServerForm] | None = None
) -> dict[str, Any]:
    rows = [
        (
            s,
            (invalid or {}).get(s.pk)
            or ProposedServerForm(auto_id=f"proposed-{s.pk}-%s", initial={"base_url": s.base_url}),
        )
        for s in viewer.servers(fleet_selectors.servers_to_set_up())
    ]
    return {"rows": rows, "form": form, "section": "servers"}


def _endpoints(server: Server) -> dict[str, object]:
    return {field: getattr(server, field) for field in EndpointsForm.base_fields}


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def ingest_tokens(request: HtmxHttpRequest) -> HttpResponse:
    """The ingest tokens, one per data source; staff create one (its secret shown in this answer
    only) or revoke one."""
    form = TokenForm(request.POST if request.method == "POST" else None)
    created: dict[str, str] = {}
    if request.method == "POST":
        _staff_only(request)
        if form.is_valid():
            try:
                created = {
                    "name": form.cleaned_data["name"],
                    "secret": tokens.create_ingest_token(**form.cleaned_data),
                }
            except tokens.NameTaken as exc:
                form.add_error("name", str(exc))
            else:
                form = TokenForm()
    context = {
        "tokens": IngestToken.objects.order_by("revoked", "name"), "form": form, "created": created,
        "memory_seconds": tokens.TOKEN_MEMORY_SECONDS,
    }  # fmt: skip
    return render(request, "setup/ingest_tokens.html", context | {"section": "ingest-tokens"})


@login_required
@require_POST
def revoke_ingest_token(request: HtmxHttpRequest, token_id: int) -> HttpResponse:
    _staff_only(request)
    revoked = tokens.revoke_ingest_token(token_id=get_object_or_404(IngestToken, pk=token_id).pk)
    messages.success(request, f"{revoked.name}: revoked; its source's batches are refused from now on.")
    return redirect("setup:ingest-tokens")


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def personal_tokens(request: HtmxHttpRequest) -> HttpResponse:
    """The user's own API tokens; they create one (its secret shown in this answer only) or revoke one."""
    user = _user(request)
    form = TokenForm(request.POST if request.method == "POST" else None)
    created: dict[str, str] = {}
    if request.method == "POST" and form.is_valid():
        token, secret = tokens.create_personal_token(user=user, name=form.cleaned_data["name"])
        created, form = {"name": token.name, "secret": secret}, TokenForm()
    context = {"tokens": PersonalToken.objects.filter(user=user), "form": form, "created": created}
    return render(request, "setup/personal_tokens.html", context | {"section": "personal-tokens"})


@login_required
@require_POST
def revoke_personal_token(request: HtmxHttpRequest, token_id: int) -> HttpResponse:
    try:
        revoked = tokens.revoke_personal_token(user=_user(request), token_id=token_id, now=timezone.now())
    except PersonalToken.DoesNotExist:
        raise PermissionDenied from None  # another user's, or none
    messages.success(request, f"{revoked.name}: revoked; calls with it are refused from now on.")
    return redirect("setup:personal-tokens")


@login_required
@require_http_methods(["GET", "POST"])
def repository(request: HtmxHttpRequest, repository_id: int) -> HttpResponse:
    """Staff point a template repository at another location, globs or branch, or change its webhook
    secret; its next import reads the new history. The list with its progress is app/prompts' page."""
    _staff_only(request)
    found = get_object_or_404(
        viewer_of(request.user).repositories(TemplateRepository.objects.all()), pk=repository_id
    )
    # A URL's credentials are never shown: the location comes without them, and given back so it
    # keeps them.
    shown = git.redacted(found.location)
    initial = {"location": shown, "globs": ", ".join(found.globs), "branch": found.branch}
    form = RepositoryEditForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            prompts.update_repository(
                found, location=found.location if data["location"] == shown else data["location"],
                globs=data["globs"], branch=data["branch"],
                secret=data["secret"] or None,
            )  # fmt: skip
        except (ValueError, prompts.RepositoryConflict) as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"{found.name}: saved; its next import reads it from there.")
            return redirect("prompts:repositories")
    context = {"repository": found, "form": form, "section": "repositories"}
    return render(request, "setup/repository.html", context)


def _staff_only(request: HtmxHttpRequest) -> None:
    if not request.user.is_staff:
        raise PermissionDenied


def _user(request: HtmxHttpRequest) -> User:
    assert isinstance(request.user, User)  # login_required
    return request.user
