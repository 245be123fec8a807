"""Each imported template version is checked by the import (app/prompts/version_checks.py): the demo
scenario's repository, a real git repository, imported like any other."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from app.diagnosis.tasks import price_version_checks
from app.prompts.history import import_template_history
from app.prompts.models import VersionCheck
from app.prompts.services import register_repository
from app.prompts.version_checks import PRICE_TASK
from simulator.scenario import TemplateChange, load_scenario, resolve_scenario
from simulator.template_repo import Commit, create_repo
from tests.prompts.conftest import GitRepo

pytestmark = pytest.mark.django_db
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def demo(tmp_path: Path) -> tuple[int, list[Commit]]:
    """The demo's template repository, registered: its id and commits."""
    scenario = load_scenario(resolve_scenario("demo"))
    commits = create_repo(tmp_path / "demo-templates", scenario, START)
    repository = register_repository(location=str(tmp_path / "demo-templates"), globs=["templates/*.j2"])
    return repository.pk, commits


def _check_of(commits: list[Commit], template: str, message: str) -> VersionCheck:
    commit = next(c for c in commits if c.template == template and c.message.startswith(message))
    return VersionCheck.objects.select_related("version").get(version__commit_sha=commit.sha)


def _fault_message(fault: str) -> tuple[str, str]:
    scenario = load_scenario(resolve_scenario("demo"))
    change = next(e for e in scenario.timeline if isinstance(e, TemplateChange) and e.fault == fault)
    return change.template, change.message


def test_the_import_checks_every_version_of_the_demo(demo: tuple[int, list[Commit]]) -> None:
    repository_id, commits = demo

    outcome = import_template_history(repository_id=repository_id, now=timezone.now())

    assert outcome.error == ""
    assert VersionCheck.objects.filter(version__template__repository_id=repository_id).count() == len(commits)
    assert len(outcome.checked) == len(commits)
    support = _check_of(commits, *_fault_message("volatile_top"))
    assert (support.verdict, support.breaks_cache, support.departs_line) == ("failed", True, 1)
    assert support.head_blocks is not None and support.base_blocks is not None
    assert support.head_blocks < support.base_blocks
    assert [f["rule"] for f in support.findings] == ["prefix-shrinks"]
    assert support.base_sha == next(c.sha for c in commits if c.message.startswith("Add the agent"))
    agent = _check_of(commits, *_fault_message("unsorted_tools"))
    assert (agent.verdict, agent.breaks_cache) == ("failed", True)
    assert {f["rule"] for f in agent.findings} == {"nondeterministic", "prefix-shrinks"}
    assert all(f["class"] != "" for f in agent.findings)
    billing = _check_of(commits, "billing", "billing: ask for the invoice number")
    assert (billing.verdict, billing.breaks_cache) == ("passed", False)
    assert billing.departs_at_token is not None  # an edit inside the prefix: the cache refills once


def test_a_templates_first_version_is_checked_alone(demo: tuple[int, list[Commit]]) -> None:
    repository_id, commits = demo

    import_template_history(repository_id=repository_id, now=timezone.now())

    for template in ("support", "billing", "agent"):  # support's is the root commit
        first = _check_of(commits, template, "Add the")
        assert first.verdict == "passed", first.findings
        assert first.head_blocks and first.head_stable_tokens and first.block_size
        assert (first.base_blocks, first.base_stable_tokens, first.departs_at_token) == (None, None, None)
        assert not first.breaks_cache
    assert _check_of(commits, "support", "Add the").base_sha == ""


def test_a_reimport_changes_no_check(demo: tuple[int, list[Commit]]) -> None:
    repository_id, _ = demo
    import_template_history(repository_id=repository_id, now=timezone.now())
    before = list(VersionCheck.objects.order_by("pk").values())

    outcome = import_template_history(repository_id=repository_id, now=timezone.now())

    assert outcome.checked == ()
    assert list(VersionCheck.objects.order_by("pk").values()) == before


def test_a_repository_without_the_describing_file_gets_checks_that_say_why(repo: GitRepo) -> None:
    repo.write("templates/support.j2", "You are Acme's support assistant.\n{{ question }}\n")
    sha = repo.commit("Add support", when=START)
    repository = register_repository(location=str(repo.path), globs=["templates/*.j2"])

    import_template_history(repository_id=repository.pk, now=timezone.now())

    check = VersionCheck.objects.get(version__commit_sha=sha)
    assert check.verdict == "error"
    assert "prefixscope.yaml is not in the repository" in check.error
    assert (check.head_blocks, check.findings) == (None, [])


@pytest.mark.usefixtures("eager")
def test_the_import_queues_the_pricing_by_name(
    demo: tuple[int, list[Commit]], django_capture_on_commit_callbacks: Any
) -> None:
    repository_id, _ = demo
    assert price_version_checks.name == PRICE_TASK  # registered, as a worker registers every app's tasks

    with django_capture_on_commit_callbacks(execute=True):
        import_template_history(repository_id=repository_id, now=timezone.now())

    # No traffic at all: every check is priced, with no price.
    checks = VersionCheck.objects.filter(version__template__repository_id=repository_id)
    assert checks.count() > 0
    assert not checks.filter(priced_at__isnull=True).exists()
    assert not checks.filter(predicted_tokens_per_hour__isnull=False).exists()


def test_a_check_that_stopped_on_a_fault_is_tried_again_at_the_next_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = create_repo(tmp_path / "templates", load_scenario(resolve_scenario("demo")), START)
    repository = register_repository(location=str(tmp_path / "templates"), globs=["templates/*.j2"])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the check")

    monkeypatch.setattr("app.prompts.version_checks.check_commits", broken)
    import_template_history(repository_id=repository.pk, now=timezone.now())
    assert {c.verdict for c in VersionCheck.objects.all()} == {"error"}
    monkeypatch.undo()

    outcome = import_template_history(repository_id=repository.pk, now=timezone.now())

    assert len(outcome.checked) == len(commits)
    assert _check_of(commits, "support", _fault_message("volatile_top")[1]).verdict == "failed"
