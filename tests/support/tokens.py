"""Personal API tokens for tests that read the API as a script does."""

from app.api.services import create_personal_token
from tests.support.users import fleet_viewer


def reader_bearer(username: str = "script") -> dict[str, str]:
    """The Authorization header of a new personal token of a new user (not staff) named `username`,
    who sees every tenant (the tests that use it are of one fleet)."""
    user = fleet_viewer(username)
    return {"Authorization": f"Bearer {create_personal_token(user=user, name='tests')[1]}"}
