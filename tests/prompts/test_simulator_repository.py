"""The demo scenario's template repository (simulator/template_repo.py) imported like any other: its
fault commits are versions of their templates, and the versions its traffic names resolve."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from app.prompts.history import import_template_history
from app.prompts.models import TemplateVersion
from app.prompts.services import register_repository, template_version_seen
from simulator.scenario import TemplateChange, load_scenario, resolve_scenario
from simulator.template_repo import AUTHOR_EMAIL, AUTHOR_NAME, create_repo, version_at

pytestmark = pytest.mark.django_db
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def test_the_demo_scenarios_commits_and_faults_are_versions(tmp_path: Path) -> None:
    scenario = load_scenario(resolve_scenario("demo"))
    commits = create_repo(tmp_path / "demo-templates", scenario, START)
    repository = register_repository(location=str(tmp_path / "demo-templates"), globs=["templates/*.j2"])

    outcome = import_template_history(repository_id=repository.pk, now=timezone.now())

    assert (outcome.error, outcome.commits) == ("", len(commits))
    faults = {e.fault: e for e in scenario.timeline if isinstance(e, TemplateChange) and e.fault}
    assert {"volatile_top", "unsorted_tools"} <= set(faults)
    for fault, change in faults.items():
        commit = next(c for c in commits if c.template == change.template and c.time == change.at)
        version = TemplateVersion.objects.get(commit_sha=commit.sha)
        assert (version.template.name, version.message, version.content) == (
            change.template,
            change.message,
            change.text,
        ), fault
        assert (version.author, version.author_email) == (AUTHOR_NAME, AUTHOR_EMAIL)
        assert version.committed_at == START + timedelta(seconds=change.at)
        assert version.diff.startswith(f"--- a/templates/{change.template}.j2\n")
    # Every version the load generator names in its requests is an imported version.
    for template in ("support", "billing", "agent"):
        sha = version_at(commits, template, scenario.duration)
        assert sha is not None
        _, seen = template_version_seen(template=template, version=sha, tenant="acme", seen_at=START)
        assert seen is not None and seen.imported_at is not None
