"""The viewer of an API caller (app/core/tenancy.py says who sees what)."""

from django.contrib.auth.base_user import AbstractBaseUser
from django.http import HttpRequest

from app.api.models import IngestToken
from app.core.tenancy import SEES_ALL, Viewer, viewer_of


def caller_viewer(request: HttpRequest) -> Viewer:
    """A user's (by session, or whichever auth put a user in request.auth) viewer; an ingest token
    sees everything: it is the fleet's own source, made by an admin, and scoped to no tenant."""
    auth = getattr(request, "auth", None)
    if isinstance(auth, IngestToken):
        return SEES_ALL
    if isinstance(auth, AbstractBaseUser):
        return viewer_of(auth)
    return viewer_of(request.user)
