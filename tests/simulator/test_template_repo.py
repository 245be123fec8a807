"""The template repository: a real git history whose commit dates are the scenario's change times."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from simulator.scenario import parse_scenario
from simulator.template_repo import (
    Commit,
    TemplateRepoError,
    create_repo,
    push,
    stage_repo,
    template_versions,
    version_at,
)
from tests.simulator.test_scenario import scenario_data

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def history_scenario_data() -> dict[str, object]:
    data = scenario_data()
    data["timeline"] = [
        {"at": 60, "template": "main", "change": {"fault": "volatile_top"}},
        {"at": 75, "salt_change": {"tenant": "a", "cache_salt": "new"}},
        {"at": 90.5, "template": "chat", "change": {"text": "Be terse.\n", "message": "chat: terse"}},
        {"at": 90.5, "template": "chat", "change": {"text": "Be kind.\n"}},
    ]
    return data


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, list[Commit]]:
    path = tmp_path / "prompts"
    return path, create_repo(path, parse_scenario(history_scenario_data()), START)


def test_every_template_version_is_one_commit_in_order(repo: tuple[Path, list[Commit]]) -> None:
    path, commits = repo

    log = git(path, "log", "--reverse", "--format=%H|%s").splitlines()

    assert log == [f"{c.sha}|{c.message}" for c in commits]
    assert [(c.template, c.time) for c in commits] == [
        ("main", 0.0),
        ("chat", 0.0),
        ("main", 60.0),
        ("chat", 90.5),
        ("chat", 90.5),
    ]
    assert [c.message for c in commits] == [
        "Add the main prompt template (completion)",
        "Add the chat prompt template (chat)",
        "main: show the current time and request id at the top of the prompt",
        "chat: terse",
        "chat: edit the prompt template",
    ]


def test_commit_dates_are_start_plus_virtual_time_in_whole_seconds(repo: tuple[Path, list[Commit]]) -> None:
    path, commits = repo

    dates = git(path, "log", "--reverse", "--format=%at %ct").split("\n")[:-1]

    expected = [int((START + timedelta(seconds=int(c.time))).timestamp()) for c in commits]
    assert dates == [f"{e} {e}" for e in expected]


def test_each_commit_changes_only_its_template_file_and_holds_its_text(
    repo: tuple[Path, list[Commit]],
) -> None:
    path, commits = repo

    first, *later = commits
    # The first commit also brings the describing file the template check reads.
    assert git(path, "show", "--name-only", "--format=", first.sha).split() == [
        "prefixscope.yaml",
        first.path,
    ]
    for commit in later:
        assert git(path, "show", "--name-only", "--format=", commit.sha).split() == [commit.path]
    for commit in commits:
        assert git(path, "show", f"{commit.sha}:{commit.path}") == commit.text
    assert commits[0].path == "templates/main.j2"
    assert git(path, "status", "--porcelain") == ""
    assert git(path, "branch", "--show-current").strip() == "main"


def test_the_commits_are_the_pure_template_versions(repo: tuple[Path, list[Commit]]) -> None:
    _, commits = repo
    versions = template_versions(parse_scenario(history_scenario_data()))

    assert [(v.template, v.at, v.text, v.message) for v in versions] == [
        (c.template, c.time, c.text, c.message) for c in commits
    ]


def test_version_at_is_the_latest_commit_at_or_before_the_time(repo: tuple[Path, list[Commit]]) -> None:
    _, commits = repo
    main_v0, chat_v0, main_v1, _chat_v1, chat_v2 = (c.sha for c in commits)

    assert version_at(commits, "main", -1) is None
    assert version_at(commits, "main", 0) == main_v0
    assert version_at(commits, "main", 59.999) == main_v0
    assert version_at(commits, "main", 60) == main_v1
    assert version_at(commits, "main", 10_000) == main_v1
    assert version_at(commits, "chat", 90) == chat_v0
    assert version_at(commits, "chat", 90.5) == chat_v2  # same time: the later commit wins
    assert version_at(list(reversed(commits)), "main", 61) == main_v1
    assert version_at(commits, "unknown", 50) is None


def test_a_folder_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x", encoding="utf-8")

    with pytest.raises(TemplateRepoError, match="not empty"):
        create_repo(tmp_path, parse_scenario(scenario_data()), START)


def test_a_start_without_timezone_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timezone"):
        create_repo(tmp_path / "r", parse_scenario(scenario_data()), datetime(2026, 3, 1))


def test_the_callers_git_environment_does_not_leak_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_AUTHOR_DATE", "@0 +0000")

    path = tmp_path / "prompts"
    commits = create_repo(path, parse_scenario(scenario_data()), START)

    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_AUTHOR_DATE")
    assert git(path, "log", "-1", "--format=%H %at").split() == [commits[-1].sha, str(int(START.timestamp()))]
    assert not (tmp_path / "elsewhere").exists()


def test_a_staged_repository_holds_what_is_live_and_gains_each_commit_when_pushed(tmp_path: Path) -> None:
    path, staging = tmp_path / "prompts", tmp_path / "author"
    commits = stage_repo(path, staging, parse_scenario(history_scenario_data()), START)

    def live() -> list[str]:
        # Every object of the repository, reachable or not: nothing of a later commit is there.
        objects = git(path, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)")
        return [line.split()[0] for line in objects.splitlines() if line.endswith(" commit")]

    assert git(staging, "log", "--reverse", "--format=%H").split() == [c.sha for c in commits]
    assert sorted(live()) == sorted(c.sha for c in commits if c.time <= 0)
    assert git(path, "rev-parse", "HEAD").strip() == commits[1].sha

    push(staging, path, commits[2])  # the fault at virtual second 60

    assert git(path, "log", "--format=%H|%cI").split() == [
        f"{c.sha}|{(START + timedelta(seconds=c.time)).isoformat()}" for c in reversed(commits[:3])
    ]
    assert (path / "templates" / "main.j2").read_text() == commits[2].text  # the work tree follows
    with pytest.raises(TemplateRepoError):
        push(staging, path, commits[1])  # not a fast-forward
