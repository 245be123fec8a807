"""Importing a real git repository's history: versions, renames, deletions, merges, re-imports."""

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.utils import timezone as django_timezone

from app.prompts.history import import_template_history
from app.prompts.models import Template, TemplateRepository, TemplateVersion
from app.prompts.services import register_repository
from tests.prompts.conftest import GitRepo

pytestmark = pytest.mark.django_db

PARIS = timezone(timedelta(hours=2))
DAY = datetime(2026, 3, 1, 10, 0, tzinfo=PARIS)


def imported(repository: TemplateRepository) -> TemplateRepository:
    outcome = import_template_history(repository_id=repository.pk, now=django_timezone.now())
    assert outcome.error == ""
    repository.refresh_from_db()
    return repository


def versions(name: str) -> list[TemplateVersion]:
    return list(TemplateVersion.objects.filter(template__name=name).order_by("committed_at"))


@pytest.fixture
def history(repo: GitRepo) -> dict[str, str]:
    """Two templates over four commits: an edit, a commit touching no template, a rename."""
    repo.write("templates/support.j2", "You are the support assistant.\nAnswer briefly.\n")
    repo.write("templates/billing.j2", "You are the billing assistant.\n")
    repo.write("templates/drafts/new.j2", "not matched: * stops at /\n")
    first = repo.commit("Add the support and billing templates", when=DAY)
    repo.write(
        "templates/support.j2", "Current time: {{ now }}\nYou are the support assistant.\nAnswer briefly.\n"
    )
    edit = repo.commit(
        "Put the time on top", when=DAY + timedelta(hours=1), author="Bob Builder", email="bob@example.com"
    )
    repo.write("README.md", "Prompt templates.\n")
    readme = repo.commit("Say what this is", when=DAY + timedelta(hours=2))
    repo.git("mv", "templates/billing.j2", "templates/invoices.j2")
    rename = repo.commit("Rename billing to invoices", when=DAY + timedelta(hours=3))
    return {"first": first, "edit": edit, "readme": readme, "rename": rename}


@pytest.fixture
def repository(repo: GitRepo) -> TemplateRepository:
    return register_repository(location=str(repo.path), globs=["templates/*.j2"])


def test_every_commit_changing_a_template_file_is_a_version(
    history: dict[str, str], repository: TemplateRepository
) -> None:
    repository = imported(repository)

    support = versions("support")
    assert [v.commit_sha for v in support] == [history["first"], history["edit"]]
    assert [(v.author, v.author_email) for v in support] == [
        ("Ada Lovelace", "ada@example.com"),
        ("Bob Builder", "bob@example.com"),
    ]
    assert [v.committed_at for v in support] == [DAY, DAY + timedelta(hours=1)]
    assert support[0].committed_at.astimezone(UTC) == datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    assert [v.message for v in support] == ["Add the support and billing templates", "Put the time on top"]
    assert support[1].content == "Current time: {{ now }}\nYou are the support assistant.\nAnswer briefly.\n"
    assert support[1].diff == (
        "--- a/templates/support.j2\n+++ b/templates/support.j2\n@@ -1,2 +1,3 @@\n"
        "+Current time: {{ now }}\n You are the support assistant.\n Answer briefly.\n"
    )
    assert support[0].diff.startswith("--- /dev/null\n+++ b/templates/support.j2\n")
    assert all(v.imported_at is not None and len(v.commit_sha) == 40 for v in support)
    assert not TemplateVersion.objects.filter(commit_sha=history["readme"]).exists()  # touched no template
    assert set(Template.objects.values_list("name", flat=True)) == {"support", "billing"}  # drafts/ unmatched
    assert (repository.state, repository.commits_imported, repository.commits_total) == ("idle", 4, 4)
    assert repository.last_imported_sha == history["rename"]


def test_a_renamed_file_keeps_its_template_and_the_rename_is_a_version(
    history: dict[str, str], repository: TemplateRepository
) -> None:
    imported(repository)
    billing = Template.objects.get(name="billing")
    assert (billing.path, billing.removed_at, billing.repository_id) == (
        "templates/invoices.j2",
        None,
        repository.pk,
    )
    rename = versions("billing")[-1]
    assert (rename.commit_sha, rename.path) == (history["rename"], "templates/invoices.j2")
    assert rename.content == "You are the billing assistant.\n"
    assert rename.diff == "rename from templates/billing.j2\nrename to templates/invoices.j2\n"


def test_importing_again_adds_only_the_new_commits(
    repo: GitRepo, history: dict[str, str], repository: TemplateRepository
) -> None:
    imported(repository)
    before = {v.pk: (v.commit_sha, v.content, v.diff) for v in TemplateVersion.objects.all()}

    again = import_template_history(repository_id=repository.pk, now=django_timezone.now())
    assert (again.commits, again.versions) == (0, 0)
    assert {v.pk: (v.commit_sha, v.content, v.diff) for v in TemplateVersion.objects.all()} == before

    repo.write("templates/support.j2", "You are the support assistant.\nAnswer briefly.\n")
    fixed = repo.commit("Move the time back down", when=DAY + timedelta(days=1))
    more = import_template_history(repository_id=repository.pk, now=django_timezone.now())
    assert (more.commits, more.versions) == (1, 1)
    assert versions("support")[-1].commit_sha == fixed
    assert TemplateVersion.objects.count() == len(before) + 1


def test_a_deleted_file_keeps_its_versions_and_comes_back_as_the_same_template(
    repo: GitRepo, history: dict[str, str], repository: TemplateRepository
) -> None:
    imported(repository)
    (repo.path / "templates/support.j2").unlink()
    repo.commit("Drop the support template", when=DAY + timedelta(days=1))
    imported(repository)
    support = Template.objects.get(name="support")
    assert support.removed_at == DAY + timedelta(days=1)
    assert len(versions("support")) == 2  # the deletion is no version

    repo.write("templates/support.j2", "Back again.\n")
    back = repo.commit("Bring the support template back", when=DAY + timedelta(days=2))
    imported(repository)
    support.refresh_from_db()
    assert support.removed_at is None
    assert versions("support")[-1].commit_sha == back


def test_a_merge_is_a_version_only_where_it_changed_a_file_itself(
    repo: GitRepo, history: dict[str, str], repository: TemplateRepository
) -> None:
    repo.git("checkout", "--quiet", "-b", "feature")
    repo.write("templates/support.j2", "Answer in French.\n")
    on_branch = repo.commit("French answers", when=DAY + timedelta(days=1))
    repo.git("checkout", "--quiet", "main")
    repo.write("templates/invoices.j2", "You are the invoices assistant.\n")
    on_main = repo.commit("Call it invoices", when=DAY + timedelta(days=1, hours=1))
    merged_at = (DAY + timedelta(days=2)).isoformat()
    merge_env = {"GIT_AUTHOR_DATE": merged_at, "GIT_COMMITTER_DATE": merged_at}
    repo.git("merge", "--quiet", "--no-ff", "-m", "Merge feature", "feature", env=merge_env)
    merge = repo.git("rev-parse", "HEAD")

    imported(repository)

    assert versions("support")[-1].commit_sha == on_branch
    assert versions("billing")[-1].commit_sha == on_main
    assert not TemplateVersion.objects.filter(commit_sha=merge).exists()


def test_a_template_name_that_traffic_used_first_is_adopted(
    history: dict[str, str], repository: TemplateRepository
) -> None:
    seen = Template.objects.create(name="support", tenant="acme")
    imported(repository)
    seen.refresh_from_db()
    assert (seen.repository_id, seen.path) == (repository.pk, "templates/support.j2")
    assert Template.objects.filter(name="support").count() == 1


def test_a_second_repository_with_a_file_of_the_same_name_gets_a_name_of_its_own(
    tmp_path: Path, history: dict[str, str], repository: TemplateRepository
) -> None:
    other = GitRepo(tmp_path / "other")
    other.write("templates/support.j2", "Another support prompt.\n")
    other.commit("Add support", when=DAY)
    imported(repository)
    imported(register_repository(location=str(other.path), globs=["templates/*.j2"]))
    assert Template.objects.filter(name="other:templates/support.j2", path="templates/support.j2").exists()


def test_a_repository_given_by_url_is_fetched_into_the_cache(
    tmp_path: Path, repo: GitRepo, history: dict[str, str]
) -> None:
    repository = register_repository(location=f"file://{repo.path}", globs=["templates/*.j2"], branch="main")
    imported(repository)
    assert (tmp_path / "cache" / f"{repository.pk}.git" / "HEAD").exists()
    assert [v.commit_sha for v in versions("support")] == [history["first"], history["edit"]]

    repo.write("templates/support.j2", "Fetched again.\n")
    later = repo.commit("Another edit", when=DAY + timedelta(days=1))
    assert imported(repository).last_imported_sha == later
    assert versions("support")[-1].content == "Fetched again.\n"


@pytest.mark.parametrize(
    ("location", "branch", "error"),
    [
        ("/nonexistent/prompts", "", "not a git repository"),
        (None, "no-such-branch", "no ref no-such-branch"),
    ],
)
def test_a_failed_import_says_why_on_the_repository(
    repo: GitRepo, history: dict[str, str], location: str | None, branch: str, error: str
) -> None:
    repository = register_repository(
        location=location or str(repo.path), globs=["templates/*.j2"], branch=branch
    )
    outcome = import_template_history(repository_id=repository.pk, now=django_timezone.now())
    repository.refresh_from_db()
    assert error in outcome.error
    assert (repository.state, repository.last_error, repository.last_imported_sha) == (
        "failed",
        outcome.error,
        "",
    )
