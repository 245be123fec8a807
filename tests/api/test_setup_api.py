"""The write API of the set-up (servers, ingest tokens) and personal tokens, as a script uses them:
with a token in the Authorization header and no session, so with no CSRF token either."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from app.api.models import IngestToken
from app.api.services import create_ingest_token, create_personal_token
from app.fleet.models import Server
from tests.setup.test_pages import ingest
from tests.support.factories import a_server
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db

SERVER = {"name": "vllm-0", "base_url": "http://vllm-0:8000", "kv_events_endpoint": "tcp://vllm-0:5557"}


def bearer(secret: str) -> Client:
    """A client as a script is: its token in every request, CSRF checks on (it has no session)."""
    return Client(enforce_csrf_checks=True, headers={"Authorization": f"Bearer {secret}"})


def personal(username: str, *, is_staff: bool) -> Client:
    user = fleet_viewer(username, is_staff=is_staff)
    return bearer(create_personal_token(user=user, name="script")[1])


def post(client: Client, path: str, body: object = None) -> tuple[int, Any]:
    response = client.post(f"/api/v1{path}", body or {}, content_type="application/json")
    return response.status_code, response.json()


def test_staff_manage_servers_with_a_personal_token() -> None:
    staff = personal("admin", is_staff=True)

    status, created = post(staff, "/servers", SERVER)
    assert status == 201 and created["state"] == "active" and created["scrape_interval_seconds"] == 15
    assert post(staff, "/servers", SERVER)[1]["code"] == "name_taken"
    changed = staff.put(
        f"/api/v1/servers/{created['id']}",
        {"base_url": "http://vllm-0:9000", "tenant": "acme"},
        content_type="application/json",
    )
    assert changed.status_code == 200
    assert (changed.json()["base_url"], changed.json()["kv_events_endpoint"]) == ("http://vllm-0:9000", "")
    assert post(staff, f"/servers/{created['id']}/disable")[1]["state"] == "disabled"
    assert post(staff, f"/servers/{created['id']}/enable")[1]["state"] == "active"

    proposed = Server.objects.create(name="vllm-1", state=Server.State.PROPOSED)
    typo = Server.objects.create(name="vlm-0", state=Server.State.PROPOSED)
    assert (
        post(staff, f"/servers/{proposed.pk}/accept", {"base_url": "http://vllm-1:8000"})[1]["state"]
        == "active"
    )
    assert post(staff, f"/servers/{typo.pk}/merge", {"into": created["id"]}) == (
        200,
        {"moved": 0, "joined": 0},
    )
    assert (
        post(staff, f"/servers/{proposed.pk}/accept", {"base_url": "http://x:1"})[1]["code"] == "wrong_state"
    )
    assert post(staff, "/servers/999999/disable")[1]["code"] == "not_found"
    assert [s["name"] for s in staff.get("/api/v1/servers").json()["items"]] == ["vllm-0", "vllm-1"]


def test_a_servers_group_is_read_and_written() -> None:
    staff = personal("admin", is_staff=True)

    status, created = post(staff, "/servers", SERVER)
    assert status == 201 and created["group"] == "platform"  # the default
    status, other = post(staff, "/servers", SERVER | {"name": "vllm-1", "group": "inference-eu"})
    assert status == 201 and other["group"] == "inference-eu"
    body = {"base_url": "http://vllm-0:8000", "group": "search_team"}
    changed = staff.put(f"/api/v1/servers/{created['id']}", body, content_type="application/json")
    assert changed.status_code == 200 and changed.json()["group"] == "search_team"

    listed = staff.get("/api/v1/servers").json()["items"]
    assert [(s["name"], s["group"]) for s in listed] == [
        ("vllm-0", "search_team"),
        ("vllm-1", "inference-eu"),
    ]
    assert staff.get("/api/v1/servers/vllm-1").json()["group"] == "inference-eu"
    assert dict(Server.objects.values_list("name", "group")) == {
        "vllm-0": "search_team",
        "vllm-1": "inference-eu",
    }


@pytest.mark.parametrize("group", ["search team", "", "équipe", "x" * 101])
def test_a_group_that_is_no_slug_is_refused_with_the_apis_error_shape(group: str) -> None:
    staff = personal("admin", is_staff=True)
    server = a_server(name="vllm-0")

    status, created = post(staff, "/servers", SERVER | {"name": "vllm-1", "group": group})
    changed = staff.put(
        f"/api/v1/servers/{server.pk}",
        {"base_url": "http://vllm-0:8000", "group": group},
        content_type="application/json",
    )

    for answer in (created, changed.json()):
        assert answer["code"] == "invalid" and list(answer["fields"]) == ["group"]
    assert (status, changed.status_code) == (400, 400)
    assert list(Server.objects.values_list("name", "group")) == [("vllm-0", "platform")]


@pytest.mark.parametrize(
    "body",
    [
        SERVER | {"base_url": "vllm-0:8000"},
        SERVER | {"kv_events_endpoint": "http://vllm-0:5557"},
        SERVER | {"name": "vllm 0"},
        SERVER | {"scrape_interval_seconds": 0},
    ],
)
def test_a_server_with_a_bad_field_is_refused(body: dict[str, object]) -> None:
    assert post(personal("admin", is_staff=True), "/servers", body)[0] == 400
    assert not Server.objects.exists()


def test_staff_create_an_ingest_token_that_ingests_until_revoked() -> None:
    Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=32)
    staff = personal("admin", is_staff=True)

    status, created = post(staff, "/ingest-tokens", {"name": "gateway-eu-1"})
    assert status == 201 and created["secret"].startswith("psi_") and not created["revoked"]
    listed = staff.get("/api/v1/ingest-tokens").json()
    assert listed == [{k: v for k, v in created.items() if k != "secret"}]  # the secret only once
    assert ingest(created["secret"]) == 200

    assert post(staff, f"/ingest-tokens/{created['id']}/revoke")[1]["revoked"] is True
    assert ingest(created["secret"]) == 401
    assert post(staff, "/ingest-tokens", {"name": "gateway-eu-1"})[1]["code"] == "name_taken"


def test_nobody_but_staff_creates_servers_or_tokens() -> None:
    engineer = personal("engineer", is_staff=False)
    session = Client()
    session.force_login(User.objects.get(username="engineer"))
    source = bearer(create_ingest_token(name="gateway"))
    live = IngestToken.objects.get(name="gateway")

    for client in (engineer, session, source, Client()):
        assert post(client, "/servers", SERVER)[0] == 401
        assert post(client, "/ingest-tokens", {"name": "mine"})[0] == 401
        assert post(client, f"/ingest-tokens/{live.pk}/revoke")[0] == 401
        assert client.get("/api/v1/ingest-tokens").status_code == 401
    assert not Server.objects.exists()
    assert list(IngestToken.objects.values_list("name", "revoked")) == [("gateway", False)]


def test_a_staff_session_writes_with_its_csrf_token_only() -> None:
    session = Client(enforce_csrf_checks=True)
    session.force_login(fleet_viewer("admin", is_staff=True))

    assert post(session, "/servers", SERVER)[0] == 403  # no X-CSRFToken
    assert not Server.objects.exists()


def test_an_ingest_token_reads_nothing() -> None:
    source = bearer(create_ingest_token(name="gateway"))

    for path in ("/templates", "/templates/repositories", "/regressions", "/requests", "/me/tokens"):
        assert source.get(f"/api/v1{path}").status_code == 401, path
    assert source.get("/api/v1/series", {"metric": "hit_rate"}).status_code == 401


def test_a_personal_token_lists_and_revokes_its_users_tokens_only() -> None:
    ada, grace = User.objects.create_user("ada"), User.objects.create_user("grace")
    mine, secret = create_personal_token(user=ada, name="laptop")
    theirs, _ = create_personal_token(user=grace, name="ci")
    client = bearer(secret)

    assert [t["name"] for t in client.get("/api/v1/me/tokens").json()] == ["laptop"]
    assert post(client, f"/me/tokens/{theirs.pk}/revoke")[0] == 404
    assert post(client, "/me/tokens", {"name": "more"})[0] == 401  # a token makes no more tokens
    assert post(client, f"/me/tokens/{mine.pk}/revoke")[1]["revoked_at"] is not None
    assert client.get("/api/v1/me/tokens").status_code == 401  # revoked: at once


def test_a_user_creates_a_personal_token_with_a_session() -> None:
    session = Client()
    session.force_login(User.objects.create_user("ada"))

    status, created = post(session, "/me/tokens", {"name": "grafana"})

    assert status == 201 and created["secret"].startswith("psu_")
    assert bearer(created["secret"]).get("/api/v1/templates").status_code == 200
    assert "secret" not in session.get("/api/v1/me/tokens").json()[0]


def test_a_disabled_users_token_is_refused() -> None:
    user = User.objects.create_user("leaver")
    client = bearer(create_personal_token(user=user, name="script")[1])
    assert client.get("/api/v1/templates").status_code == 200

    User.objects.filter(pk=user.pk).update(is_active=False)

    assert client.get("/api/v1/templates").status_code == 401


def test_an_ingest_tokens_post_needs_no_csrf_token() -> None:
    # The session auth came first and refused such a POST with 403 (CSRF cookie not set): the test
    # client skips CSRF checks unless asked, so only a script's real POST saw it.
    source = bearer(create_ingest_token(name="ci"))

    status, created = post(
        source, "/templates/repositories", {"location": "https://git.example.com/p.git", "globs": ["*.j2"]}
    )

    assert status == 201 and created["name"] == "p"
