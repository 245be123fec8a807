"""The template check on real git repositories: determinism, the boundary marker, golden copies,
configuration errors and exit statuses (the demo's fault commits: test_template_check_demo.py)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from app.domain.templatecheck.check import Report
from app.domain.templatecheck.findings import Rule
from app.prompts.templatecheck.run import CannotCheck, CheckRequest, run_check

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
SAMPLES = [
    {"question": "How do I reset it?", "user": "ana", "schema": {"b": 1, "a": 2}, "tags": ["x", "y", "z"]},
    {"question": "Why is it slow?", "user": "bo", "schema": {"b": 1, "a": 2}, "tags": ["x", "y", "z"]},
]


def git(root: Path, *args: str) -> str:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env |= {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid"}  # fmt: skip
    return subprocess.run(
        ["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True
    ).stdout


def commit(root: Path, files: dict[str, str], message: str = "change") -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    git(root, "add", "-A")
    git(root, "commit", "--quiet", "--allow-empty", "-m", message)
    return git(root, "rev-parse", "HEAD").strip()


def describing_file(**entry: Any) -> str:
    template = {
        "files": "prompts/*.j2",
        "per_request": ["question"],
        "per_user": ["user"],
        "samples": SAMPLES,
    }
    template |= entry
    body = {"version": 1, "tokenizer": "gpt2", "block_size": 16,
            "jinja": {"trim_blocks": True, "lstrip_blocks": True}, "templates": [template]}  # fmt: skip
    return yaml.safe_dump(body)


POLICY = "You are the assistant of a router maker. Follow the policies below, exactly and briefly.\n" * 6
GOOD = POLICY + "=== request ===\nUser {{ user }} asks: {{ question }}\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "templates"
    root.mkdir()
    git(root, "init", "--quiet", "--initial-branch=main")
    return root


def check(root: Path, base: str, head: str, **extra: Any) -> Report:
    return run_check(CheckRequest(str(root), base, head, NOW, **extra), cache=root.parent / "cache")


def only(report: Report, rule: Rule) -> list[Any]:
    return [finding for finding in report.findings if finding.rule == rule]


def test_a_template_like_its_base_passes_with_its_stable_prefix_measured(repo: Path) -> None:
    base = commit(repo, {"prefixscope.yaml": describing_file(marker="=== request ==="), "prompts/a.j2": GOOD})
    head = commit(repo, {}, "nothing")

    report = check(repo, base, head)

    assert report.exit_status == 0 and report.findings == []
    side = report.results[0].head
    assert side is not None and side.stable_tokens > 16 * 6
    assert side.stable_text == POLICY  # everything above the marker, as the server tokenizes it


@pytest.mark.parametrize(
    ("line", "variable", "label", "klass"),
    [
        ("Today is {{ now().strftime('%Y-%m-%d %H:%M') }}.\n", None, "wall clock", "timestamp"),
        ("Schema: {{ schema | dumps }}\n", "schema", "dict order", "json_key_order"),
        ("{% for tag in tags %}\n- {{ tag }}\n{% endfor %}\n", "tags", "set order", "reordered_items"),
    ],
)
def test_a_render_that_changes_under_a_perturbation_fails_at_its_line(
    repo: Path, line: str, variable: str | None, label: str, klass: str
) -> None:
    config = describing_file(marker="=== request ===", unordered=["tags"])
    base = commit(repo, {"prefixscope.yaml": config, "prompts/a.j2": GOOD})
    head = commit(repo, {"prompts/a.j2": POLICY[:200] + "\n" + line + POLICY[200:] + GOOD[len(POLICY) :]})

    report = check(repo, base, head)

    finding, *others = only(report, Rule.NONDETERMINISTIC)  # a clock shown in local time: the zone too
    assert (finding.line, finding.variable, finding.klass) == (4, variable, klass)
    assert label in finding.message and "line 4" in finding.message
    assert [
        other.line for other in others if "(time zone)" in other.message or "time zone" in other.message
    ] == ([4] if variable is None else [])
    assert len(others) == (1 if variable is None else 0)
    assert report.exit_status == 1


def test_a_builder_command_iterating_a_set_fails_under_another_hash_seed(repo: Path) -> None:
    builder = textwrap.dedent(
        """\
        import json, sys
        sample = json.load(sys.stdin)
        tools = set(sample["tags"])  # iteration order follows the process's hash seed
        print("You are a helpful agent.\\n" * 20 + "Tools: " + ", ".join(tools))
        print("Question: " + sample["question"])
        """
    )
    entry = {"files": "build.py", "command": ["python3", "build.py"], "samples": SAMPLES}
    base = commit(repo, {"prefixscope.yaml": describing_file(**entry), "build.py": builder})

    report = check(repo, base, base)

    [finding] = only(report, Rule.NONDETERMINISTIC)
    assert "hash seed" in finding.message and finding.klass == "reordered_items"
    assert finding.line is None  # a command's output has no template lines


def test_a_builder_command_does_not_run_where_commands_are_refused(repo: Path) -> None:
    entry = {"files": "build.py", "command": ["python3", "build.py"], "samples": SAMPLES}
    base = commit(repo, {"prefixscope.yaml": describing_file(**entry), "build.py": "raise SystemExit(3)\n"})

    report = check(repo, base, base, allow_commands=False)

    [finding] = only(report, Rule.CANNOT_RENDER)
    assert "run only in the repository's own CI" in finding.message and report.exit_status == 2


def test_a_per_request_variable_above_the_marker_fails_the_boundary(repo: Path) -> None:
    base = commit(repo, {"prefixscope.yaml": describing_file(marker="=== request ==="), "prompts/a.j2": GOOD})
    moved = POLICY + "Asked by {{ user }}.\n" + "=== request ===\nQuestion: {{ question }}\n"
    head = commit(repo, {"prompts/a.j2": moved})

    report = check(repo, base, head)

    [finding] = only(report, Rule.ABOVE_MARKER)
    assert (finding.line, finding.variable, finding.klass) == (7, "user", "per_user")
    assert report.exit_status == 1


def test_a_marker_missing_from_the_render_fails(repo: Path) -> None:
    base = commit(repo, {"prefixscope.yaml": describing_file(marker="=== request ==="), "prompts/a.j2": GOOD})
    head = commit(repo, {"prompts/a.j2": GOOD.replace("=== request ===", "--- request ---")})

    [finding] = only(check(repo, base, head), Rule.MARKER_MISSING)
    assert "=== request ===" in finding.message


def test_a_golden_drift_fails_until_the_golden_is_updated_in_the_same_commit(repo: Path) -> None:
    config = describing_file(marker="=== request ===", golden="golden/{name}.txt")
    first = commit(repo, {"prefixscope.yaml": config, "prompts/a.j2": GOOD})
    missing = check(repo, first, first)
    assert "is missing" in only(missing, Rule.GOLDEN_DRIFT)[0].message
    call_command("check_templates", repo=str(repo), base=first, head=first, update_golden=True)
    assert (repo / "golden/a.txt").read_text() == POLICY
    kept = commit(repo, {}, "add the golden prefix")
    edited = commit(repo, {"prompts/a.j2": "Be brief. " + GOOD})

    drifted = check(repo, kept, edited)
    [finding] = only(drifted, Rule.GOLDEN_DRIFT)
    assert (finding.line, finding.token) == (1, 0) and drifted.exit_status == 1

    call_command("check_templates", repo=str(repo), base=kept, head=edited, update_golden=True)
    reviewed = commit(repo, {}, "the golden prefix follows the edit")
    assert only(check(repo, kept, reviewed), Rule.GOLDEN_DRIFT) == []


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("version: 1\nblock_size: 16\ntemplates: []\n", "templates: List should have at least 1 item"),
        ("version: 1\nblock_size: 16\ntemplates: [{files: a.j2, samples: [{}], colour: red}]\n",
         "templates.0.colour: Extra inputs are not permitted"),
        ("version: 1\nblock_size: 16\n"
         "templates: [{files: a.j2, per_request: [q], samples: [{q: 1}, {q: 1}]}]\n",
         "`q` changes per request, but the samples give it one value"),
        ("version: 1\nblock_size: 0\ntemplates: [{files: a.j2, samples: [{}]}]\n",
         "block_size: Input should be greater than 0"),
        ("version: [\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_a_bad_describing_file_cannot_run_and_says_where(repo: Path, config: str, expected: str) -> None:
    sha = commit(repo, {"prefixscope.yaml": config, "a.j2": "x"})

    with pytest.raises(CannotCheck, match=r"prefixscope\.yaml: ") as raised:
        check(repo, sha, sha)
    assert expected in str(raised.value)


def test_a_template_that_does_not_render_cannot_run(repo: Path) -> None:
    base = commit(repo, {"prefixscope.yaml": describing_file(), "prompts/a.j2": GOOD})
    head = commit(repo, {"prompts/a.j2": GOOD + "{{ missing_variable }}\n"})

    report = check(repo, base, head)

    [finding] = only(report, Rule.CANNOT_RENDER)
    assert "missing_variable" in finding.message and report.exit_status == 2


@pytest.mark.parametrize(
    ("head_text", "status"), [(GOOD, 0), ("{{ question }}\n" + GOOD, 1), ("{% if %}", 2)]
)
def test_the_command_exits_0_1_or_2_and_writes_each_format(
    repo: Path, tmp_path: Path, head_text: str, status: int
) -> None:
    base = commit(repo, {"prefixscope.yaml": describing_file(), "prompts/a.j2": GOOD})
    head = commit(repo, {"prompts/a.j2": head_text})
    for form in ("text", "json", "sarif"):
        output = tmp_path / f"report.{form}"
        with pytest.raises(SystemExit) as exited:
            call_command(
                "check_templates", repo=str(repo), base=base, head=head, format=form, output=str(output)
            )
        assert exited.value.code == status
        assert output.read_text().strip()
    assert json.loads((tmp_path / "report.json").read_text())["exit_status"] == status


def test_an_unknown_revision_cannot_run(repo: Path) -> None:
    sha = commit(repo, {"prefixscope.yaml": describing_file(), "prompts/a.j2": GOOD})
    with pytest.raises(SystemExit) as exited:
        call_command("check_templates", repo=str(repo), base="no-such-branch", head=sha)
    assert exited.value.code == 2


def test_revisions_are_read_as_git_reads_them(repo: Path) -> None:
    first = commit(repo, {"prefixscope.yaml": describing_file(), "prompts/a.j2": GOOD})
    second = commit(repo, {"prompts/a.j2": "Be brief. " + GOOD})
    third = commit(repo, {}, "nothing")

    for base, head in (("HEAD~2", "HEAD^"), ("main^^", "main~1"), (first[:8], second), ("HEAD~2", "HEAD~0^")):
        report = check(repo, base, head)
        assert (report.base, report.head) == (first, second), (base, head)
    assert check(repo, "HEAD", "HEAD").head == third
    with pytest.raises(CannotCheck, match="no commit, branch or tag 'HEAD~3'"):
        check(repo, "HEAD~3", "HEAD")
