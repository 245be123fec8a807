"""Personal API tokens for tests that read the API as a script does."""

from django.contrib.auth.models import User

from app.api.services import create_personal_token


def reader_bearer(username: str = "script") -> dict[str, str]:
    """The Authorization header of a new personal token of a new user (not staff) named `username`."""
    user = User.objects.create_user(username)
    return {"Authorization": f"Bearer {create_personal_token(user=user, name='tests')[1]}"}
