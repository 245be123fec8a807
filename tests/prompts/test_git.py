"""The pure parts: globs, diffs, locations, webhook URLs. No database."""

import pytest

from app.prompts import git
from app.prompts.selectors import comparable_url

NO_NEWLINE = "\\ No newline at end of file\n"


@pytest.mark.parametrize(
    ("globs", "path", "matches"),
    [
        (["templates/*.j2"], "templates/support.j2", True),
        (["templates/*.j2"], "templates/drafts/support.j2", False),
        (["templates/*.j2"], "support.j2", False),
        (["**/*.j2"], "a/b/c.j2", True),
        (["prompts/**", "*.txt"], "prompts/x/y.md", True),
        (["prompts/**", "*.txt"], "notes/a.txt", False),
    ],
)
def test_globs_are_git_wildmatch_patterns(globs: list[str], path: str, matches: bool) -> None:
    assert git.path_matcher(globs)(path) is matches


def test_a_malformed_glob_is_refused() -> None:
    with pytest.raises(ValueError, match="malformed glob"):
        git.path_matcher(["templates/[a"])


@pytest.mark.parametrize(
    ("old", "new", "old_path", "path", "diff"),
    [
        ("a\n", "a\n", "t.j2", "t.j2", ""),
        ("a\n", "a\n", "t.j2", "u.j2", "rename from t.j2\nrename to u.j2\n"),
        ("", "a\n", "", "t.j2", "--- /dev/null\n+++ b/t.j2\n@@ -0,0 +1 @@\n+a\n"),
        (
            "a",
            "b",
            "t.j2",
            "t.j2",
            "--- a/t.j2\n+++ b/t.j2\n@@ -1 +1 @@\n-a\n" + NO_NEWLINE + "+b\n" + NO_NEWLINE,
        ),
    ],
)
def test_diffs_read_as_git_prints_them(old: str, new: str, old_path: str, path: str, diff: str) -> None:
    assert git.unified_diff(old, new, old_path=old_path, path=path) == diff


@pytest.mark.parametrize(
    ("location", "problem"),
    [
        ("/srv/prompts", None),
        ("https://git.example.com/acme/prompts.git", None),
        ("file:///srv/prompts", None),
        ("relative/path", "a local path must be absolute"),
        ("ssh://git@example.com/prompts.git", "ssh:// is not fetched"),
        ("https:///no-host", "the URL has no host"),
    ],
)
def test_a_location_is_an_absolute_path_or_an_http_or_file_url(location: str, problem: str | None) -> None:
    found = git.location_problem(location)
    assert found == problem if problem is None else (found or "").startswith(problem)


def test_credentials_in_a_url_are_never_shown() -> None:
    assert git.redacted("https://bot:hunter2@git.example.com/p.git") == "https://git.example.com/p.git"
    assert git.redacted("/srv/prompts") == "/srv/prompts"


@pytest.mark.parametrize(
    "url",
    [
        "https://git.example.com/acme/prompts",
        "https://GIT.example.com/acme/prompts.git",
        "http://git.example.com/acme/prompts/",
        "https://token:x@git.example.com:443/acme/prompts.git/",
    ],
)
def test_a_webhooks_url_spellings_name_one_repository(url: str) -> None:
    assert comparable_url(url) == "git.example.com/acme/prompts"


def test_other_ports_paths_and_schemes_are_other_repositories() -> None:
    assert comparable_url("https://git.example.com:8443/acme/prompts") == "git.example.com:8443/acme/prompts"
    assert comparable_url("https://git.example.com/acme/Prompts") != comparable_url(
        "https://git.example.com/acme/prompts"
    )
    assert comparable_url("/srv/prompts") == comparable_url("ssh://git@example.com/x") == ""
