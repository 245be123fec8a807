"""Who may call the API: the one place the read and write routes take their authentication from.

- A person: a logged-in session (writes send Django's CSRF token as X-CSRFToken), or one of their
  personal API tokens (`Authorization: Bearer psu_…`), which acts as that user: `request.user` is
  theirs, so whatever scoping applies to the user applies to the token.
- A data source: an ingest token (`Bearer psi_…`) pushes (ingest, template repositories, deploys) and
  reads nothing.

The bearer auths come first in each list: django-ninja stops at the first auth that raises, and the
session auth raises on a POST without a CSRF token (a script's POST with a token has none). The
session auths here look only at requests that carry a session cookie, so a script whose token is
refused is answered 401, not 403 for a CSRF token it never needed.
"""

from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer
from ninja.security.session import SessionAuth, SessionAuthIsStaff

from app.api.ingest.rest import IngestTokenAuth
from app.api.services import authenticate_personal_token

PERSONAL_PREFIX = "psu_"


class PersonalTokenAuth(HttpBearer):
    """A live personal token of an active user (of a staff user, with `staff_only`): the request is
    that user's. As IngestTokenAuth, the header is read here: HttpBearer logs a header of another
    scheme whole under DEBUG."""

    def __init__(self, *, staff_only: bool = False) -> None:
        super().__init__()
        self.staff_only = staff_only

    def __call__(self, request: HttpRequest) -> AbstractBaseUser | None:
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret.startswith(PERSONAL_PREFIX):
            return None
        token = authenticate_personal_token(secret, now=timezone.now())
        if token is None or (self.staff_only and not token.user.is_staff):
            return None
        request.user = token.user
        return token.user

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        raise AssertionError("unused: __call__ reads the header")  # HttpBearer declares it abstract


class _WithSessionCookie:
    """A session auth that passes (None: the next auth, or 401) on a request without a session cookie,
    before django-ninja's CSRF check, which would answer 403."""

    def __call__(self, request: HttpRequest) -> Any:
        if settings.SESSION_COOKIE_NAME not in request.COOKIES:
            return None
        return super().__call__(request)  # type: ignore[misc]


class PersonSession(_WithSessionCookie, SessionAuth):
    """A logged-in user's session (a POST with X-CSRFToken)."""


class StaffSession(_WithSessionCookie, SessionAuthIsStaff):
    """A logged-in staff user's session (a POST with X-CSRFToken)."""


PEOPLE = [PersonalTokenAuth(), PersonSession()]
"""Any logged-in user, or a user's personal token."""
STAFF = [PersonalTokenAuth(staff_only=True), StaffSession()]
"""A staff user's session or personal token: set-up writes (servers, ingest tokens)."""
READERS = PEOPLE
"""The read routes: people only; an ingest token reads nothing."""
WRITERS = [IngestTokenAuth(), *STAFF]
"""Writes a data source's CI may make too (template repositories, deploys): staff, or an ingest token."""

READ_AUTH = "Authenticated by a logged-in user's session, or a personal API token (Authorization: Bearer)."
WRITE_AUTH = (
    "Authenticated by a staff user's session (send Django's CSRF token as X-CSRFToken) or personal API "
    "token, or an ingest token (Authorization: Bearer)."
)
STAFF_AUTH = (
    "Staff only: a staff user's session (send Django's CSRF token as X-CSRFToken) or personal API token "
    "(Authorization: Bearer)."
)
