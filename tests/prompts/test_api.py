"""The REST API of template repositories, templates, versions and deploys, and who may use it."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from app.fleet.models import Server
from app.prompts.history import import_template_history
from app.prompts.models import DeployMarker, Template, TemplateRepository
from app.prompts.services import register_repository
from tests.prompts.conftest import GitRepo
from tests.support.tokens import reader_bearer

pytestmark = pytest.mark.django_db
REPOSITORIES = "/api/v1/templates/repositories"
DAY = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def shas(repo: GitRepo) -> list[str]:
    repo.write("templates/support.j2", "one\n")
    first = repo.commit("First", when=DAY)
    repo.write("templates/support.j2", "two\n")
    second = repo.commit("Second", when=DAY + timedelta(hours=1))
    repo.git("tag", "v2")
    return [first, second]


@pytest.fixture
def imported(repo: GitRepo, shas: list[str]) -> Template:
    repository = register_repository(location=str(repo.path), globs=["templates/*.j2"], secret="hush")
    assert import_template_history(repository_id=repository.pk, now=timezone.now()).error == ""
    return Template.objects.get(name="support")


def post(client: Client, url: str, body: object, token: str = "") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = client.post(url, json.dumps(body), content_type="application/json", headers=headers)
    return response.status_code, response.json()


def test_staff_register_a_repository_and_its_first_import_runs(
    staff: Client, eager: None, repo: GitRepo, shas: list[str]
) -> None:
    body = {"location": str(repo.path), "globs": ["templates/*.j2"], "branch": "main", "secret": "hush"}
    status, answer = post(staff, REPOSITORIES, body)
    assert status == 201, answer
    assert answer["name"] == "prompts" and answer["has_webhook_secret"] is True
    assert "secret" not in answer and "hush" not in json.dumps(answer)
    repository = staff.get(f"{REPOSITORIES}/{answer['id']}").json()
    assert (repository["state"], repository["commits_imported"], repository["commits_total"]) == (
        "idle",
        2,
        2,
    )
    assert repository["last_imported_sha"] == shas[1]
    assert post(staff, REPOSITORIES, body)[0] == 409


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"location": "relative/path", "globs": ["*.j2"]}, "absolute"),
        ({"location": "/srv/p", "globs": ["/etc/*"]}, "relative"),
        ({"location": "/srv/p", "globs": ["templates/[a"]}, "malformed glob"),
        ({"location": "ssh://git@example.com/p.git", "globs": ["*.j2"]}, "ssh://"),
    ],
)
def test_a_bad_location_or_glob_is_a_400(staff: Client, body: dict[str, object], error: str) -> None:
    status, answer = post(staff, REPOSITORIES, body)
    assert status == 400
    assert error in answer["message"]


def test_who_may_register(client: Client, engineer: Client, token: str, eager: None, remote: str) -> None:
    path_body = {"location": "/srv/prompts", "globs": ["*.j2"]}
    assert post(Client(), REPOSITORIES, path_body)[0] == 401  # nobody
    assert post(engineer, REPOSITORIES, path_body)[0] == 401  # logged in, not staff
    status, answer = post(Client(), REPOSITORIES, path_body, token=token)
    assert (status, answer["message"]) == (403, "an ingest token registers http(s) URLs only")
    assert post(Client(), REPOSITORIES, {"location": remote, "globs": ["*.j2"]}, token=token)[0] == 201


def test_repositories_are_read_with_their_progress_and_without_credentials(
    engineer: Client, token: str
) -> None:
    register_repository(location="https://bot:pa55@git.example.com/p.git", globs=["*.j2"], secret="hush")
    assert Client(headers={"Authorization": f"Bearer {token}"}).get(REPOSITORIES).status_code == 401  # ingest
    for reader in (engineer, Client(headers=reader_bearer())):
        [repository] = reader.get(REPOSITORIES).json()
        assert repository["location"] == "https://git.example.com/p.git"
        assert repository["state"] == "idle"
    assert Client().get(REPOSITORIES).status_code == 401
    assert engineer.get(f"{REPOSITORIES}/999999").status_code == 404


def test_import_now_queues_an_import(staff: Client, eager: None, repo: GitRepo, shas: list[str]) -> None:
    repository = register_repository(location=str(repo.path), globs=["templates/*.j2"])
    response = staff.post(f"{REPOSITORIES}/{repository.pk}/import")
    assert (response.status_code, response.json()) == (202, {"repository": repository.pk, "queued": True})
    repository.refresh_from_db()
    assert repository.last_imported_sha == shas[1]
    assert staff.post(f"{REPOSITORIES}/999999/import").status_code == 404


def test_templates_and_their_versions(engineer: Client, imported: Template, shas: list[str]) -> None:
    [template] = engineer.get("/api/v1/templates").json()
    assert (template["name"], template["path"], template["versions"]) == (
        "support",
        "templates/support.j2",
        2,
    )
    assert template["repository"]["name"] == "prompts"

    page = engineer.get(f"/api/v1/templates/{imported.pk}/versions").json()
    assert page["count"] == 2
    assert [v["sha"] for v in page["items"]] == [shas[1], shas[0]]
    assert page["items"][0] | {"committed_at": None} == {
        "sha": shas[1], "author": "Ada Lovelace", "author_email": "ada@example.com", "committed_at": None,
        "message": "Second", "path": "templates/support.j2", "tags": ["v2"], "imported": True,
    }  # fmt: skip
    assert "content" not in page["items"][0] and "diff" not in page["items"][0]


@pytest.mark.parametrize("name", ["full", "short", "tag"])
def test_a_version_with_its_content_and_diff_by_full_or_short_sha_or_tag(
    engineer: Client, imported: Template, shas: list[str], name: str
) -> None:
    wanted = {"full": shas[1], "short": shas[1][:7], "tag": "v2"}[name]
    version = engineer.get(f"/api/v1/templates/{imported.pk}/versions/{wanted}").json()
    assert (version["sha"], version["content"]) == (shas[1], "two\n")
    assert version["diff"].endswith("-one\n+two\n")


def test_an_unknown_version_or_template_is_a_404(engineer: Client, imported: Template) -> None:
    assert engineer.get(f"/api/v1/templates/{imported.pk}/versions/v9").status_code == 404
    assert engineer.get("/api/v1/templates/999999/versions/v2").status_code == 404
    assert engineer.get("/api/v1/templates/999999/versions").status_code == 404


def test_a_deploy_marker_by_short_sha_on_one_server(token: str, imported: Template, shas: list[str]) -> None:
    Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000")
    body = {"template": "support", "version": shas[0][:8], "server": "vllm-0", "note": "canary",
            "deployed_at": "2026-03-02T10:00:00+01:00"}  # fmt: skip
    status, answer = post(Client(), "/api/v1/deploys", body, token=token)
    assert status == 201, answer
    assert (answer["version"], answer["server"], answer["note"], answer["source"]) == (
        shas[0], "vllm-0", "canary", "api"
    )  # fmt: skip
    marker = DeployMarker.objects.get(pk=answer["id"])
    assert marker.deployed_at == datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_a_deploy_without_a_time_is_now_and_by_tag(
    staff: Client, imported: Template, shas: list[str]
) -> None:
    before = timezone.now()
    status, answer = post(staff, "/api/v1/deploys", {"template": "support", "version": "v2"})
    assert (status, answer["version"], answer["server"]) == (201, shas[1], None)
    assert DeployMarker.objects.get(pk=answer["id"]).deployed_at >= before


def test_a_deploy_of_a_sha_not_imported_yet_is_kept_for_the_import(staff: Client, imported: Template) -> None:
    status, answer = post(staff, "/api/v1/deploys", {"template": "support", "version": "ABCDEF12345"})
    assert (status, answer["version"]) == (201, "abcdef12345")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"template": "nope", "version": "v2"}, "no template named 'nope'"),
        ({"template": "support", "version": "v9"}, "no version 'v9' of support"),
        ({"template": "support", "version": "v2", "server": "ghost"}, "no server named 'ghost'"),
    ],
)
def test_a_deploy_naming_nothing_known_is_a_404(
    staff: Client, imported: Template, body: dict[str, str], error: str
) -> None:
    answer = {"code": "not_found", "message": error, "fields": {}}
    assert post(staff, "/api/v1/deploys", body) == (404, answer)


def test_deploys_need_staff_or_a_token(engineer: Client, imported: Template) -> None:
    assert post(engineer, "/api/v1/deploys", {"template": "support", "version": "v2"})[0] == 401
    assert not DeployMarker.objects.exists()


def test_the_openapi_document_says_how_each_endpoint_authenticates(client: Client) -> None:
    paths = client.get("/api/openapi.json").json()["paths"]
    assert "ingest token" in paths["/api/v1/templates/repositories"]["post"]["description"]
    assert "staff" in paths["/api/v1/deploys"]["post"]["description"]
    assert "X-Hub-Signature-256" in paths["/api/v1/templates/hooks/git"]["post"]["description"]
    assert TemplateRepository.objects.count() == 0
