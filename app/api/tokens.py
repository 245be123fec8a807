"""API tokens. Ingest tokens (one per data source; staff create and revoke them) and a user's own
personal tokens. A secret is in the answer that creates its token and in no other answer, page or
log line: only its sha256 is stored."""

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Router, Schema, Status

from app.api import services
from app.api.auth import PEOPLE, STAFF, STAFF_AUTH, PersonSession
from app.api.errors import ApiError, error
from app.api.models import IngestToken, PersonalToken

router = Router(tags=["tokens"])


class TokenIn(Schema):
    name: str = Field(min_length=1, max_length=100, description="Which source (or what) uses it")


class IngestTokenOut(Schema):
    id: int
    name: str
    created_at: datetime
    last_used_at: datetime | None = Field(description="To the minute")
    revoked: bool


class PersonalTokenOut(Schema):
    id: int
    name: str
    created_at: datetime
    last_used_at: datetime | None = Field(description="To the minute")
    revoked_at: datetime | None


class IngestTokenCreated(IngestTokenOut):
    secret: str = Field(description="Send as Authorization: Bearer <secret>. Shown this once only.")


class PersonalTokenCreated(PersonalTokenOut):
    secret: str = Field(description="Send as Authorization: Bearer <secret>. Shown this once only.")


@router.get(
    "/ingest-tokens",
    auth=STAFF,
    response=list[IngestTokenOut],
    summary="Ingest tokens",
    description=STAFF_AUTH,
)
def list_ingest_tokens(request: HttpRequest) -> Any:
    return IngestToken.objects.order_by("revoked", "name")


@router.post(
    "/ingest-tokens",
    auth=STAFF,
    response={201: IngestTokenCreated, 409: ApiError},
    summary="Create an ingest token for a data source",
    description="The answer holds its secret, the only time it is shown. 409: a token of that name exists. "
    + STAFF_AUTH,
)
def create_ingest_token(request: HttpRequest, body: TokenIn) -> Any:
    try:
        secret = services.create_ingest_token(name=body.name)
    except services.NameTaken as exc:
        return error(409, str(exc), code="name_taken")
    token = IngestToken.objects.get(name=body.name)
    return Status(201, IngestTokenCreated(secret=secret, **IngestTokenOut.from_orm(token).dict()))


@router.post(
    "/ingest-tokens/{token_id}/revoke",
    auth=STAFF,
    response={200: IngestTokenOut, 404: ApiError},
    summary="Revoke an ingest token",
    description=f"Its source's batches are refused (401) from now on: at once by the web process that "
    f"answers, by the others within {services.TOKEN_MEMORY_SECONDS} s (each remembers live tokens that "
    "long). " + STAFF_AUTH,
)
def revoke_ingest_token(request: HttpRequest, token_id: int) -> Any:
    try:
        return services.revoke_ingest_token(token_id=token_id)
    except IngestToken.DoesNotExist:
        return error(404, "no such ingest token")


@router.get(
    "/me/tokens",
    auth=PEOPLE,
    response=list[PersonalTokenOut],
    summary="Your personal API tokens",
    description="Authenticated by a logged-in session or a personal token.",
)
def list_personal_tokens(request: HttpRequest) -> Any:
    return PersonalToken.objects.filter(user=_user(request))


@router.post(
    "/me/tokens",
    auth=PersonSession(),
    response={201: PersonalTokenCreated},
    summary="Create a personal API token",
    description="It reads the API as you. The answer holds its secret, the only time it is shown. A "
    "logged-in session only (with X-CSRFToken): a token does not make more tokens.",
)
def create_personal_token(request: HttpRequest, body: TokenIn) -> Any:
    token, secret = services.create_personal_token(user=_user(request), name=body.name)
    return Status(201, PersonalTokenCreated(secret=secret, **PersonalTokenOut.from_orm(token).dict()))


@router.post(
    "/me/tokens/{token_id}/revoke",
    auth=PEOPLE,
    response={200: PersonalTokenOut, 404: ApiError},
    summary="Revoke one of your personal API tokens",
    description="Calls with it are refused (401) from now on. Authenticated by a logged-in session or a "
    "personal token (which may revoke itself).",
)
def revoke_personal_token(request: HttpRequest, token_id: int) -> Any:
    try:
        return services.revoke_personal_token(user=_user(request), token_id=token_id, now=timezone.now())
    except PersonalToken.DoesNotExist:
        return error(404, "you have no such token")


def _user(request: HttpRequest) -> User:
    """The user the request is authenticated as (by session or personal token: both set request.user)."""
    assert isinstance(request.user, User)
    return request.user
