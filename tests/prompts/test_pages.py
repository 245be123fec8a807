"""The template repositories page: the list with import progress (the same view serves the htmx
fragment that polls while an import runs), the register form and the import button."""

from datetime import UTC, datetime

import pytest
from django.test import Client

from app.prompts.models import TemplateRepository
from app.prompts.services import register_repository
from tests.prompts.conftest import GitRepo
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db
PAGE = "/templates/repositories/"


def test_the_page_asks_for_a_login(client: Client) -> None:
    response = client.get(PAGE)
    assert (response.status_code, response["Location"].startswith("/login/")) == (302, True)


def test_the_page_lists_repositories_with_their_import_progress(engineer: Client) -> None:
    repository = register_repository(location="https://bot:pa55@git.example.com/prompts.git", globs=["*.j2"])
    TemplateRepository.objects.filter(pk=repository.pk).update(
        state="running", commits_imported=30, commits_total=120
    )
    html = engineer.get(PAGE).content.decode()
    assert "<html" in html and 'href="/templates/"' in html  # the nav link, to the Templates list
    assert "https://git.example.com/prompts.git" in html and "pa55" not in html
    assert 'value="25"' in html and "30 / 120" in html and "Importing" in html
    assert 'hx-trigger="every 2s"' in html  # polls while it runs
    assert "Register a repository" not in html and "Import now" not in html  # staff only


def test_an_htmx_poll_gets_only_the_list_and_stops_polling_when_done(engineer: Client) -> None:
    register_repository(location="/srv/prompts", globs=["*.j2"])
    html = engineer.get(PAGE, headers={"HX-Request": "true"}).content.decode()
    assert html.lstrip().startswith('<section id="repository-list"')
    assert "<html" not in html and "hx-trigger" not in html  # idle: no more polling


def test_staff_register_a_repository_with_the_form_and_it_imports(
    staff: Client, eager: None, repo: GitRepo
) -> None:
    repo.write("templates/support.j2", "Hello.\n")
    repo.commit("Add support", when=datetime(2026, 3, 1, tzinfo=UTC))
    form = {
        "location": str(repo.path),
        "globs": "templates/*.j2, prompts/*.txt",
        "branch": "",
        "secret": "s",
        "name": "",
    }
    response = staff.post(PAGE, form)
    assert (response.status_code, response["Location"]) == (302, PAGE)
    repository = TemplateRepository.objects.get()
    assert (repository.globs, repository.webhook_secret, repository.commits_imported) == (
        ["templates/*.j2", "prompts/*.txt"], "s", 1
    )  # fmt: skip
    html = staff.get(PAGE).content.decode()
    assert "import queued" in html and "Import now" in html


def test_a_bad_form_is_shown_with_its_errors(staff: Client) -> None:
    response = staff.post(PAGE, {"location": "relative", "globs": "templates/[a"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "a local path must be absolute" in html and "malformed glob" in html
    assert not TemplateRepository.objects.exists()


def test_the_import_button_queues_an_import_for_staff_only(staff: Client, eager: None, repo: GitRepo) -> None:
    repo.write("templates/support.j2", "Hello.\n")
    repo.commit("Add support", when=datetime(2026, 3, 1, tzinfo=UTC))
    repository = register_repository(location=str(repo.path), globs=["templates/*.j2"])
    url = f"/templates/repositories/{repository.pk}/import/"
    response = staff.post(url, headers={"HX-Request": "true"})
    assert response.content.decode().lstrip().startswith('<section id="repository-list"')
    repository.refresh_from_db()
    assert repository.commits_imported == 1
    staff.force_login(fleet_viewer("viewer"))
    assert staff.post(url).status_code == 403
    assert staff.post(PAGE, {"location": "/srv/x", "globs": "*.j2"}).status_code == 403
