"""The template check on the demo's template repository (simulator/template_repo.py, with the describing
file simulator/template_describe.py writes), tokenized with the served model's own tokenizer: the
folder the real vLLM CPU server loads (tests/support/vllm_cpu.py), chat template included."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.domain.templatecheck.check import Report
from app.domain.templatecheck.findings import Rule
from app.prompts.templatecheck.run import CheckRequest, run_check
from simulator.scenario import load_scenario, resolve_scenario
from simulator.template_repo import Commit, create_repo
from tests.support.vllm_cpu import build_model

pytestmark = pytest.mark.vllm  # for the served model's folder, built with the vLLM install

START = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Commit], str]:
    root = tmp_path_factory.mktemp("demo") / "templates"
    commits = create_repo(root, load_scenario(resolve_scenario("demo")), START)
    return root, commits, str(build_model())


def check_commit(demo: tuple[Path, list[Commit], str], template: str, at: float) -> Report:
    """The check of the scenario's commit of `template` at virtual second `at` against its parent."""
    root, commits, tokenizer = demo
    index = next(i for i, c in enumerate(commits) if c.template == template and c.time == at)
    request = CheckRequest(str(root), commits[index - 1].sha, commits[index].sha, START, tokenizer=tokenizer)
    return run_check(request, cache=root.parent / "cache")


def test_volatile_top_fails_at_its_first_line_with_a_timestamp(demo: tuple[Path, list[Commit], str]) -> None:
    report = check_commit(demo, "support", 300)

    [shrinks] = [f for f in report.findings if f.rule == Rule.PREFIX_SHRINKS]
    assert (shrinks.template, shrinks.line, shrinks.token) == ("support", 1, 0)
    assert (shrinks.variable, shrinks.klass) == ("now", "timestamp")
    [support] = [r for r in report.results if r.name == "support"]
    assert support.change is not None and support.change.base_blocks >= 20 and support.change.head_blocks == 0
    assert support.head is not None and support.head.ends is not None and support.head.ends.line == 1
    assert report.exit_status == 1 and report.tokenizer.endswith("model")


def test_unsorted_tools_fail_at_the_loop_over_tools_as_reordered_items(
    demo: tuple[Path, list[Commit], str],
) -> None:
    report = check_commit(demo, "agent", 780)

    [unsorted] = [f for f in report.findings if f.rule == Rule.NONDETERMINISTIC]
    assert (unsorted.template, unsorted.line, unsorted.variable) == ("agent", 6, "tools")
    assert unsorted.klass == "reordered_items" and "(set order)" in unsorted.message
    [shrinks] = [f for f in report.findings if f.rule == Rule.PREFIX_SHRINKS]
    assert shrinks.token == unsorted.token and shrinks.line == 6
    assert report.exit_status == 1


def test_the_harmless_billing_edit_passes(demo: tuple[Path, list[Commit], str]) -> None:
    report = check_commit(demo, "billing", 480)

    assert report.exit_status == 0
    assert [f.level for f in report.findings] == ["note"]  # its stable prefix grows: one refill
    [billing] = [r for r in report.results if r.name == "billing"]
    assert billing.change is not None and billing.change.direction == "grows"
