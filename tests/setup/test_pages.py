"""The set-up pages, as a person uses them: servers registered, edited, disabled and accepted; ingest
and personal tokens created (the secret shown in that one answer) and revoked, with their effect on
the ingest and the API at once. Staff change the fleet and the ingest tokens; everybody their own
tokens."""

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from app.api.models import IngestToken, PersonalToken
from app.fleet.models import Server
from app.prompts.models import TemplateRepository
from app.traffic.models import RequestRecord
from tests.api.test_ingest import record
from tests.api.test_secrets_stay_out_of_logs import every_log_record, secrets_in
from tests.support.factories import a_server
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db
__all__ = ["every_log_record"]  # the fixture

SERVER = {
    "name": "vllm-0", "base_url": "http://vllm-0:8000", "metrics_url": "", "kv_events_endpoint": "tcp://vllm-0:5557",
    "kv_replay_endpoint": "", "kv_topic": "", "model": "", "tenant": "acme", "group": "platform",
    "scrape_interval_seconds": "15",
}  # fmt: skip
SECRET = re.compile(r'value="(ps[iu]_[A-Za-z0-9_-]+)"')


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(fleet_viewer("admin", is_staff=True))
    return client


@pytest.fixture
def engineer() -> Client:
    client = Client()
    client.force_login(fleet_viewer("engineer"))
    return client


def shown_secret(html: str) -> str:
    [secret] = SECRET.findall(html)
    return str(secret)


def ingest(token: str) -> int:
    """The status of a one-record REST ingest with the token (the real capture's record)."""
    body = [record("completion-shared-prefix-the", server="vllm-0")]
    headers = {"Authorization": f"Bearer {token}"}
    return (
        Client().post("/api/v1/requests", body, content_type="application/json", headers=headers).status_code
    )


def test_staff_register_a_server_which_is_pulled(staff: Client) -> None:
    response = staff.post("/setup/servers/", SERVER)

    assert response.status_code == 302
    server = Server.objects.get(name="vllm-0")
    assert (server.state, server.base_url, server.kv_events_endpoint, server.tenant) == (
        "active", "http://vllm-0:8000", "tcp://vllm-0:5557", "acme"
    )  # fmt: skip
    listed = staff.get("/setup/servers/").content.decode()
    assert "vllm-0 is registered" in listed and f'href="/setup/servers/{server.pk}/"' in listed
    again = staff.post("/setup/servers/", SERVER | {"base_url": "http://elsewhere:8000"})
    assert "a server named vllm-0 exists already" in again.content.decode()
    assert Server.objects.get(name="vllm-0").base_url == "http://vllm-0:8000"


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("base_url", "vllm-0:8000", "Enter an http:// or https:// URL"),
        ("kv_events_endpoint", "http://vllm-0:5557", "Enter a ZMQ endpoint tcp://host:port"),
        ("name", "vllm 0", "Enter a valid"),
    ],
)
def test_a_server_with_a_bad_endpoint_is_not_registered(
    staff: Client, field: str, value: str, error: str
) -> None:
    response = staff.post("/setup/servers/", SERVER | {field: value})

    assert response.status_code == 200 and error in response.content.decode()
    assert not Server.objects.exists()


def test_staff_edit_a_server_and_disable_it_and_enable_it(staff: Client) -> None:
    server = a_server(name="vllm-0")

    edited = SERVER | {"base_url": "http://vllm-0:9000", "scrape_interval_seconds": "30", "name": "renamed"}
    assert staff.post(f"/setup/servers/{server.pk}/", edited).status_code == 302
    server.refresh_from_db()
    assert (server.name, server.base_url, server.scrape_interval_seconds, server.block_size) == (
        "vllm-0", "http://vllm-0:9000", 30, 16
    )  # fmt: skip

    staff.post(f"/setup/servers/{server.pk}/enabled/", {"enabled": "false"})
    server.refresh_from_db()
    assert server.state == Server.State.DISABLED
    fragment = staff.post(
        f"/setup/servers/{server.pk}/enabled/", {"enabled": "true"}, headers={"HX-Request": "true"}
    )
    assert fragment.content.decode().strip().startswith('<section id="server-list">')
    assert "vllm-0 is active" in fragment.content.decode()
    server.refresh_from_db()
    assert server.state == Server.State.ACTIVE


def test_staff_set_a_servers_group_which_its_pages_show(staff: Client) -> None:
    register = staff.get("/setup/servers/").content.decode()
    assert 'name="group" value="platform"' in register  # the default, offered

    assert staff.post("/setup/servers/", SERVER | {"group": "inference-eu"}).status_code == 302
    server = Server.objects.get(name="vllm-0")
    assert server.group == "inference-eu"
    assert "<td>inference-eu</td>" in staff.get("/setup/servers/").content.decode()
    assert 'name="group" value="inference-eu"' in staff.get(f"/setup/servers/{server.pk}/").content.decode()

    assert staff.post(f"/setup/servers/{server.pk}/", SERVER | {"group": "search"}).status_code == 302
    server.refresh_from_db()
    assert server.group == "search"
    assert ">group search</span>" in staff.get(f"/servers/{server.pk}/").content.decode()


@pytest.mark.parametrize("group", ["search team", ""])
def test_a_group_that_is_no_slug_is_not_saved(staff: Client, group: str) -> None:
    server = a_server(name="vllm-1", group="search")

    registered = staff.post("/setup/servers/", SERVER | {"group": group})
    edited = staff.post(f"/setup/servers/{server.pk}/", SERVER | {"group": group})

    for page in (registered, edited):
        assert page.status_code == 200 and 'class="field invalid"' in page.content.decode()
    assert list(Server.objects.values_list("name", "group")) == [("vllm-1", "search")]


def test_staff_accept_a_proposed_server_or_merge_one_into_a_registered_one(staff: Client) -> None:
    registered = a_server(name="vllm-0")
    typo = Server.objects.create(name="vlm-0", state=Server.State.PROPOSED)
    real = Server.objects.create(name="vllm-1", state=Server.State.PROPOSED)
    assert staff.get(f"/setup/servers/{typo.pk}/").status_code == 404  # a proposed one is not edited

    page = staff.post(f"/setup/servers/{real.pk}/proposed/", {"action": "accept", "base_url": ""})
    assert "Accepting needs the server&#x27;s base URL" in page.content.decode()
    staff.post(f"/setup/servers/{real.pk}/proposed/", {"action": "accept", "base_url": "http://vllm-1:8000"})
    staff.post(f"/setup/servers/{typo.pk}/proposed/", {"action": "merge", "into": registered.pk})

    assert dict(Server.objects.values_list("name", "state")) == {"vllm-0": "active", "vllm-1": "active"}
    again = staff.post(f"/setup/servers/{real.pk}/proposed/", {"action": "accept", "base_url": "http://x:1"})
    assert "vllm-1 is active, not proposed" in staff.get(again["Location"]).content.decode()


def test_people_who_are_not_staff_read_the_set_up_and_change_nothing(engineer: Client) -> None:
    server = a_server(name="vllm-0")
    proposed = Server.objects.create(name="vllm-1", state=Server.State.PROPOSED)
    token = IngestToken.objects.create(name="gateway", token_sha256="0" * 64)

    page = engineer.get("/setup/servers/").content.decode()
    assert "vllm-0" in page and "Register a server" not in page and "Accept" not in page
    assert "Create an ingest token" not in engineer.get("/setup/ingest-tokens/").content.decode()
    refused = [
        engineer.post("/setup/servers/", SERVER | {"name": "vllm-2"}),
        engineer.post(f"/setup/servers/{server.pk}/", SERVER | {"base_url": "http://evil:80"}),
        engineer.post(f"/setup/servers/{server.pk}/enabled/", {"enabled": "false"}),
        engineer.post(
            f"/setup/servers/{proposed.pk}/proposed/", {"action": "accept", "base_url": "http://x:1"}
        ),
        engineer.post("/setup/ingest-tokens/", {"name": "mine"}),
        engineer.post(f"/setup/ingest-tokens/{token.pk}/revoke/"),
    ]
    assert [r.status_code for r in refused] == [403] * 6
    assert list(Server.objects.values_list("name", "state", "base_url").order_by("name")) == [
        ("vllm-0", "active", "http://vllm-0:8000"), ("vllm-1", "proposed", ""),
    ]  # fmt: skip
    assert list(IngestToken.objects.values_list("name", "revoked")) == [("gateway", False)]
    assert Client().get("/setup/servers/").status_code == 302  # to the login


def test_an_ingest_token_made_on_the_page_ingests_until_it_is_revoked(
    staff: Client, every_log_record: Callable[[], str]
) -> None:
    Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=32)

    created = staff.post("/setup/ingest-tokens/", {"name": "gateway-eu-1"})
    secret = shown_secret(created.content.decode())

    assert created.status_code == 200 and "no-store" in created["Cache-Control"]
    token = IngestToken.objects.get(name="gateway-eu-1")
    assert token.token_sha256 != secret and secret not in token.token_sha256
    assert secret not in staff.get("/setup/ingest-tokens/").content.decode()  # shown that once only
    assert ingest(secret) == 200
    assert RequestRecord.objects.count() == 1
    token.refresh_from_db()
    assert token.last_used_at is not None

    staff.post(f"/setup/ingest-tokens/{token.pk}/revoke/")

    assert ingest(secret) == 401  # at once: this process forgot the token it remembered
    assert "gateway-eu-1: revoked" in staff.get("/setup/ingest-tokens/").content.decode()
    assert secrets_in(every_log_record(), secret) == []
    taken = staff.post("/setup/ingest-tokens/", {"name": "gateway-eu-1"}).content.decode()
    assert "an ingest token named gateway-eu-1 exists already" in taken and not SECRET.search(taken)


def test_a_personal_token_reads_the_api_as_its_user_and_cannot_ingest(
    engineer: Client, every_log_record: Callable[[], str]
) -> None:
    Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=32)

    created = engineer.post("/setup/tokens/", {"name": "grafana"})
    secret = shown_secret(created.content.decode())
    bearer = Client(headers={"Authorization": f"Bearer {secret}"})

    assert secret not in engineer.get("/setup/tokens/").content.decode()
    assert bearer.get("/api/v1/templates").status_code == 200
    assert [t["name"] for t in bearer.get("/api/v1/me/tokens").json()] == ["grafana"]  # as its user
    assert ingest(secret) == 401
    assert not RequestRecord.objects.exists()
    token = PersonalToken.objects.get()
    assert token.user.username == "engineer" and token.last_used_at is not None

    engineer.post(f"/setup/tokens/{token.pk}/revoke/")

    assert bearer.get("/api/v1/templates").status_code == 401
    assert "grafana: revoked" in engineer.get("/setup/tokens/").content.decode()
    assert secrets_in(every_log_record(), secret) == []


def test_nobody_revokes_another_users_token(engineer: Client) -> None:
    other = User.objects.create_user("other")
    token = PersonalToken.objects.create(user=other, name="theirs", token_sha256="1" * 64)

    assert engineer.post(f"/setup/tokens/{token.pk}/revoke/").status_code == 403
    assert "theirs" not in engineer.get("/setup/tokens/").content.decode()
    token.refresh_from_db()
    assert token.revoked_at is None


def test_the_set_up_is_in_the_navigation(engineer: Client) -> None:
    assert '<a href="/setup/servers/">Set-up</a>' in engineer.get("/setup/tokens/").content.decode()


def test_staff_repoint_a_template_repository_and_keep_its_secret_unless_typed(
    staff: Client, engineer: Client
) -> None:
    repository = TemplateRepository.objects.create(
        name="prompts",
        location="https://git.example.com/prompts.git",
        globs=["*.j2"],
        webhook_secret="hush",
        last_imported_sha="a" * 40,
    )
    url = f"/setup/repositories/{repository.pk}/"
    moved = {
        "location": "https://git.example.com/moved.git",
        "globs": "templates/*.j2, *.md",
        "branch": "main",
    }

    assert engineer.post(url, moved | {"secret": "mine"}).status_code == 403
    assert 'value="hush"' not in staff.get(url).content.decode()  # the secret is never shown
    assert staff.post(url, moved | {"secret": ""}).status_code == 302

    repository.refresh_from_db()
    assert (repository.name, repository.location, repository.globs, repository.branch) == (
        "prompts", "https://git.example.com/moved.git", ["templates/*.j2", "*.md"], "main"
    )  # fmt: skip
    assert repository.webhook_secret == "hush" and repository.last_imported_sha == ""  # another history
    staff.post(url, moved | {"secret": "new"})
    repository.refresh_from_db()
    assert repository.webhook_secret == "new"
    with_credentials = "https://bot:pa55@git.example.com/moved.git"
    TemplateRepository.objects.filter(pk=repository.pk).update(location=with_credentials)
    page = staff.get(url).content.decode()
    assert "pa55" not in page and 'value="https://git.example.com/moved.git"' in page
    staff.post(url, moved | {"branch": "release"})  # the location given back as shown
    repository.refresh_from_db()
    assert (repository.location, repository.branch) == (with_credentials, "release")
    refused = staff.post(url, moved | {"location": "ftp://x/y"})
    assert refused.status_code == 200 and "errorlist" in refused.content.decode()
