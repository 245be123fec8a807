"""manage.py register_template_repository: register or update, and import now with progress."""

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from app.prompts.models import TemplateRepository, TemplateVersion
from tests.prompts.conftest import GitRepo

pytestmark = pytest.mark.django_db
DAY = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def history(repo: GitRepo) -> list[str]:
    shas = []
    for i in range(3):
        repo.write("templates/support.j2", f"version {i}\n")
        shas.append(repo.commit(f"Version {i}", when=DAY + timedelta(hours=i)))
    return shas


def run(*args: str) -> str:
    out = StringIO()
    call_command("register_template_repository", *args, stdout=out)
    return out.getvalue()


def test_register_and_import_now_prints_progress(
    repo: GitRepo, history: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMPTS_HOOK_SECRET", "from-the-environment")
    out = run(str(repo.path), "--glob", "templates/*.j2", "--glob", "prompts/**", "--branch", "main",
              "--secret-env", "PROMPTS_HOOK_SECRET", "--import-now")  # fmt: skip
    repository = TemplateRepository.objects.get()
    assert out.splitlines() == [
        f"registered template repository prompts (id {repository.pk})",
        "  3/3 commits",
        "imported 3 commits of prompts: 3 versions",
    ]
    assert (repository.globs, repository.branch, repository.webhook_secret) == (
        ["templates/*.j2", "prompts/**"], "main", "from-the-environment"
    )  # fmt: skip
    assert "from-the-environment" not in out
    assert TemplateVersion.objects.count() == 3


def test_registering_again_by_name_updates_it_and_keeps_the_secret(
    tmp_path: object, repo: GitRepo, history: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET", "kept")
    run(
        str(repo.path), "--glob", "templates/*.j2", "--name", "demo", "--secret-env", "SECRET", "--import-now"
    )
    other = GitRepo(repo.path.parent / "round-1")
    other.write("templates/support.j2", "another round\n")
    sha = other.commit("Round 1", when=DAY + timedelta(days=1))

    out = run(str(other.path), "--glob", "templates/*.j2", "--name", "demo", "--import-now")

    repository = TemplateRepository.objects.get()
    assert out.splitlines()[0] == f"updated template repository demo (id {repository.pk})"
    assert (repository.location, repository.webhook_secret, repository.last_imported_sha) == (
        str(other.path), "kept", sha
    )  # fmt: skip
    assert TemplateVersion.objects.filter(template__name="support").count() == 4  # the template goes on


def test_a_relative_path_is_made_absolute(
    repo: GitRepo, history: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo.path.parent)
    run("prompts", "--glob", "templates/*.j2")
    assert TemplateRepository.objects.get().location == str(repo.path)


def test_the_secret_comes_from_a_set_variable_only(repo: GitRepo) -> None:
    with pytest.raises(CommandError, match="NO_SUCH_VARIABLE is not set"):
        run(str(repo.path), "--glob", "*.j2", "--secret-env", "NO_SUCH_VARIABLE")
    assert not TemplateRepository.objects.exists()


def test_a_failed_import_is_a_command_error(tmp_path: object) -> None:
    with pytest.raises(CommandError, match="not a git repository"):
        run("/nonexistent/prompts", "--glob", "*.j2", "--import-now")
    assert TemplateRepository.objects.get().state == "failed"
