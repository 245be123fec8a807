"""POST /api/v1/templates/hooks/git: GitHub- and GitLab-shaped push deliveries and their secrets.

The repository is served over git's smart HTTP (dulwich's server), so a push delivery names it by
its URL and the import it queues fetches it from there.
"""

import hashlib
import hmac
import json
import logging
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
from django.test import Client

from app.prompts.models import TemplateRepository, TemplateVersion
from app.prompts.services import register_repository
from tests.prompts.conftest import GitRepo

pytestmark = pytest.mark.django_db
URL = "/api/v1/templates/hooks/git"
SECRET = "s3cret-shared-with-the-forge"
GITHUB = "X-GitHub-Event"
GITLAB = "X-Gitlab-Event"


@pytest.fixture
def repository(repo: GitRepo, remote: str) -> TemplateRepository:
    repo.write("templates/support.j2", "Hello.\n")
    repo.commit("Add support", when=datetime(2026, 3, 1, tzinfo=UTC))
    return register_repository(location=remote, globs=["templates/*.j2"], secret=SECRET)


@pytest.fixture
def web_url(remote: str) -> str:
    """The repository's page as a forge's payload spells it: no .git, a trailing slash."""
    return remote.removesuffix(".git") + "/"


def github_body(url: str) -> bytes:
    payload = {
        "ref": "refs/heads/main",
        "repository": {"clone_url": url.rstrip("/") + ".git", "html_url": url},
    }
    return json.dumps(payload).encode()


def gitlab_body(url: str) -> bytes:
    payload = {
        "ref": "refs/heads/main",
        "project": {"git_http_url": url.rstrip("/") + ".git", "web_url": url},
    }
    return json.dumps(payload).encode()


def signature(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def deliver(client: Client, body: bytes, query: str = "", **headers: str) -> tuple[int, dict[str, object]]:
    response = client.post(URL + query, body, content_type="application/json", headers=headers)
    return response.status_code, response.json()


def test_a_signed_github_push_imports_the_repository_it_names(
    client: Client, eager: None, repository: TemplateRepository, web_url: str
) -> None:
    body = github_body(web_url)
    status, answer = deliver(client, body, **{GITHUB: "push", "X-Hub-Signature-256": signature(body)})
    assert (status, answer) == (202, {"repository": repository.pk, "queued": True, "detail": "import queued"})
    assert TemplateVersion.objects.filter(template__name="support").count() == 1
    repository.refresh_from_db()
    assert (repository.state, repository.commits_imported, repository.commits_total) == ("idle", 1, 1)


def test_a_gitlab_push_with_its_token_imports_the_repository(
    client: Client, eager: None, repository: TemplateRepository, web_url: str
) -> None:
    status, _ = deliver(client, gitlab_body(web_url), **{GITLAB: "Push Hook", "X-Gitlab-Token": SECRET})
    assert status == 202
    assert TemplateVersion.objects.count() == 1


def test_a_form_encoded_github_delivery_is_read_too(
    client: Client, eager: None, repository: TemplateRepository, web_url: str
) -> None:
    body = urlencode({"payload": github_body(web_url).decode()}).encode()
    response = client.post(
        URL,
        body,
        content_type="application/x-www-form-urlencoded",
        headers={GITHUB: "push", "X-Hub-Signature-256": signature(body)},
    )
    assert response.status_code == 202


@pytest.mark.parametrize(
    ("provider", "credential", "status"),
    [
        ("github", None, 401),
        ("github", "sha256=" + "0" * 64, 403),
        ("github", "sha256=wrong", 403),
        ("github", "another secret's signature", 403),
        ("gitlab", None, 401),
        ("gitlab", SECRET + "x", 403),
        ("gitlab", "ünïcode", 403),
    ],
)
def test_a_missing_or_wrong_secret_is_refused_and_imports_nothing(
    client: Client, eager: None, repository: TemplateRepository, web_url: str,
    provider: str, credential: str | None, status: int,
) -> None:  # fmt: skip
    body = github_body(web_url) if provider == "github" else gitlab_body(web_url)
    headers = {GITHUB: "push"} if provider == "github" else {GITLAB: "Push Hook"}
    if credential == "another secret's signature":
        credential = signature(body, "another secret")
    if credential is not None:
        headers["X-Hub-Signature-256" if provider == "github" else "X-Gitlab-Token"] = credential
    code, answer = deliver(client, body, **headers)
    assert code == status
    assert isinstance(answer["message"], str)
    assert not TemplateVersion.objects.exists()


def test_a_signature_over_another_body_is_refused(
    client: Client, eager: None, repository: TemplateRepository, web_url: str
) -> None:
    signed = signature(github_body(web_url))
    tampered = github_body(web_url).replace(b"main", b"evil")
    assert deliver(client, tampered, **{GITHUB: "push", "X-Hub-Signature-256": signed})[0] == 403


def test_a_repository_without_a_secret_takes_no_webhook(
    client: Client, repository: TemplateRepository, web_url: str
) -> None:
    TemplateRepository.objects.filter(pk=repository.pk).update(webhook_secret="")
    code, answer = deliver(client, gitlab_body(web_url), **{GITLAB: "Push Hook", "X-Gitlab-Token": SECRET})
    assert code == 403
    assert "no webhook secret" in str(answer["message"])


def test_the_repository_can_be_named_by_id(
    client: Client, eager: None, repository: TemplateRepository
) -> None:
    body = github_body("https://mirror.example.com/acme/prompts")
    headers = {GITHUB: "push", "X-Hub-Signature-256": signature(body)}
    assert deliver(client, body, **headers)[0] == 404
    assert deliver(client, body, f"?repository={repository.pk}", **headers)[0] == 202
    assert deliver(client, body, f"?repository={repository.pk + 1000}", **headers)[0] == 404


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"{not json", {GITHUB: "push"}),
        (b"[1, 2]", {GITLAB: "Push Hook"}),
        (b"\xff\xfe", {GITLAB: "Push Hook"}),
        (b'{"repository": {}}', {}),  # neither provider's header
    ],
)
def test_a_malformed_delivery_is_a_400(
    client: Client, repository: TemplateRepository, body: bytes, headers: dict[str, str]
) -> None:
    code, answer = deliver(client, body, **headers)
    assert code == 400
    assert isinstance(answer["message"], str)


def test_an_unknown_repository_is_a_404(client: Client, repository: TemplateRepository) -> None:
    body = gitlab_body("https://git.example.com/acme/other")
    assert deliver(client, body, **{GITLAB: "Push Hook", "X-Gitlab-Token": SECRET})[0] == 404


def test_a_ping_is_answered_without_an_import(
    client: Client, eager: None, repository: TemplateRepository, web_url: str
) -> None:
    body = github_body(web_url)
    code, answer = deliver(client, body, **{GITHUB: "ping", "X-Hub-Signature-256": signature(body)})
    assert (code, answer["queued"]) == (200, False)
    assert not TemplateVersion.objects.exists()


def test_secrets_and_signatures_stay_out_of_the_logs(
    client: Client,
    caplog: pytest.LogCaptureFixture,
    eager: None,
    repository: TemplateRepository,
    web_url: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    body = github_body(web_url)
    deliver(client, body, **{GITHUB: "push", "X-Hub-Signature-256": signature(body)})
    deliver(client, body, **{GITHUB: "push", "X-Hub-Signature-256": signature(body, "guess")})
    deliver(client, gitlab_body(web_url), **{GITLAB: "Push Hook", "X-Gitlab-Token": SECRET})
    deliver(client, gitlab_body(web_url), **{GITLAB: "Push Hook", "X-Gitlab-Token": "guess"})
    assert "imported 1 commits" in caplog.text  # the log was captured
    for secret in (SECRET, signature(body)[7:], signature(body, "guess")[7:], "guess"):
        assert secret not in caplog.text
