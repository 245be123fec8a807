"""`manage.py check_templates --format sarif` on the demo's template repository (a real git repository
built here): the failing `volatile_top` and `unsorted_tools` commits and the harmless `billing` edit,
each log valid against the official SARIF 2.1.0 schema and placed on the template's line."""

import difflib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.core.management import call_command

from simulator.scenario import Scenario, TemplateChange, load_scenario, resolve_scenario
from simulator.template_repo import Commit, create_repo, template_file
from tests.support.sarif import sarif_problems

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
Demo = tuple[Path, Scenario, list[Commit]]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    scenario = load_scenario(resolve_scenario("demo"))
    path = tmp_path_factory.mktemp("demo") / "templates"
    return path, scenario, create_repo(path, scenario, START)


def _fault(demo: Demo, fault: str) -> tuple[Commit, Commit]:
    """The fault's commit and its parent."""
    _, scenario, commits = demo
    change = next(e for e in scenario.timeline if isinstance(e, TemplateChange) and e.fault == fault)
    index = next(i for i, c in enumerate(commits) if (c.template, c.time) == (change.template, change.at))
    return commits[index - 1], commits[index]


def _sarif(repo: Path, base: Commit, head: Commit, output: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    args = ["--repo", str(repo), "--base", base.sha, "--head", head.sha, "--format", "sarif"]
    with pytest.raises(SystemExit) as exited:
        call_command("check_templates", *args, "--output", str(output))
    return int(exited.value.code or 0), json.loads(output.read_text(encoding="utf-8"))


def _first_changed_line(before: str, after: str) -> int:
    """The 1-based line of ``after`` where it first departs from ``before``."""
    opcodes = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines()).get_opcodes()
    return next(j1 for tag, _, _, j1, _ in opcodes if tag != "equal") + 1


def _located(log: dict) -> list[tuple[str, str, str, int | None]]:  # type: ignore[type-arg]
    return [
        (
            r["ruleId"], r["level"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            r["locations"][0]["physicalLocation"].get("region", {}).get("startLine"),
        )
        for r in log["runs"][0]["results"]
    ]  # fmt: skip


def test_the_volatile_top_commit_fails_on_its_first_changed_line(demo: Demo, tmp_path: Path) -> None:
    base, head = _fault(demo, "volatile_top")
    before = next(c for c in demo[2] if c.template == head.template and c.time < head.time)

    status, log = _sarif(demo[0], base, head, tmp_path / "prefixscope.sarif")

    assert sarif_problems(log) == []
    assert status == 1
    line = _first_changed_line(before.text, head.text)
    assert ("prefix-shrinks", "error", template_file(head.template), line) in _located(log)
    assert {r["level"] for r in log["runs"][0]["results"]} == {"error"}


def test_the_unsorted_tools_commit_fails_determinism_on_its_loop(demo: Demo, tmp_path: Path) -> None:
    base, head = _fault(demo, "unsorted_tools")

    status, log = _sarif(demo[0], base, head, tmp_path / "prefixscope.sarif")

    assert sarif_problems(log) == []
    assert status == 1
    loop = next(i for i, text in enumerate(head.text.splitlines(), 1) if "for" in text and "tools" in text)
    assert ("nondeterministic", "error", template_file(head.template), loop) in _located(log)


def test_the_billing_edit_passes_with_a_valid_log(demo: Demo, tmp_path: Path) -> None:
    _, scenario, commits = demo
    change = next(e for e in scenario.timeline if isinstance(e, TemplateChange) and e.template == "billing")
    index = next(i for i, c in enumerate(commits) if (c.template, c.time) == ("billing", change.at))

    status, log = _sarif(demo[0], commits[index - 1], commits[index], tmp_path / "prefixscope.sarif")

    assert sarif_problems(log) == []
    assert status == 0
    assert all(level != "error" for _, level, _, _ in _located(log))
