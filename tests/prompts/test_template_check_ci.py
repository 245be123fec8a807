"""The CI files of docs/ci/ that run the template check: each valid against the schema its CI system
publishes (check-jsonschema's vendored copies), and its command line, expanded by a real shell, one
that `manage.py check_templates`'s own parser takes, writing the SARIF file the job uploads."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError

from app.prompts.management.commands.check_templates import Command

CI = Path(__file__).resolve().parents[2] / "docs" / "ci"
GITHUB, GITLAB = CI / "github-template-check.yml", CI / "gitlab-template-check.yml"
SHELL_VARIABLES = {
    "base": "1" * 40, "BASE": "1" * 40, "BASE_SHA": "3" * 40, "HEAD_SHA": "2" * 40, "CI_COMMIT_SHA": "2" * 40,
    "GITHUB_WORKSPACE": "/work/templates", "CI_PROJECT_DIR": "/work/templates", "RUNNER_TEMP": "/tmp/runner",
}  # fmt: skip


def _validate(path: Path, schema: str) -> subprocess.CompletedProcess[str]:
    """check-jsonschema's command line on ``path`` with its vendored copy of ``schema``."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", f"vendor.{schema}", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(("path", "schema"), [(GITHUB, "github-workflows"), (GITLAB, "gitlab-ci")])
def test_each_ci_file_is_valid_against_its_systems_schema(path: Path, schema: str) -> None:
    done = _validate(path, schema)

    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schemas_refuse_a_broken_file(tmp_path: Path) -> None:
    """The validation is live: a workflow without `runs-on` and a job with an unknown key fail."""
    github = yaml.safe_load(GITHUB.read_text(encoding="utf-8"))
    del github["jobs"]["template-check"]["runs-on"]
    gitlab = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))
    gitlab["prefixscope-template-check"]["artifact"] = {"paths": ["x"]}
    for name, body, schema in (("gh.yml", github, "github-workflows"), ("gl.yml", gitlab, "gitlab-ci")):
        (tmp_path / name).write_text(yaml.safe_dump(body), encoding="utf-8")
        assert _validate(tmp_path / name, schema).returncode == 1, name


def _check_line(commands: list[str]) -> str:
    lines = [line.strip() for text in commands for line in text.splitlines()]
    [line] = [line for line in lines if line.startswith("python manage.py check_templates ")]
    return line


def _parsed(line: str, *, server: str | None) -> dict[str, Any]:
    """The options the command's parser makes of ``line`` as bash expands it."""
    environment = {
        "PATH": os.environ["PATH"],
        **SHELL_VARIABLES,
        **({"PREFIXSCOPE_URL": server} if server else {}),
    }
    words = line.removeprefix("python manage.py check_templates ")
    done = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {words}"], env=environment, capture_output=True, text=True, check=True
    )
    args = done.stdout.split("\0")[:-1]
    return vars(Command().create_parser("manage.py", "check_templates").parse_args(args))


def _github() -> tuple[str, Path]:
    workflow = yaml.safe_load(GITHUB.read_text(encoding="utf-8"))
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the key `on` as True
    steps = workflow["jobs"]["template-check"]["steps"]
    upload = next(s for s in steps if s.get("uses", "").startswith("github/codeql-action/upload-sarif@"))
    assert upload["if"].startswith("always()")  # a failing check still uploads its findings
    return _check_line([s["run"] for s in steps if "run" in s]), Path("/work/templates") / upload["with"][
        "sarif_file"
    ]


def _gitlab() -> tuple[str, Path]:
    job = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))["prefixscope-template-check"]
    assert job["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "merge_request_event"'}]
    assert job["artifacts"]["when"] == "always"
    [kept] = job["artifacts"]["paths"]
    return _check_line(job["script"]), Path("/work/templates") / kept


@pytest.mark.parametrize("ci", [_github, _gitlab])
@pytest.mark.parametrize("server", [None, "https://prefixscope.example.com"])
def test_the_ci_command_parses_and_writes_the_uploaded_sarif(ci: Any, server: str | None) -> None:
    line, uploaded = ci()

    options = _parsed(line, server=server)

    assert options["format"] == "sarif"
    assert Path(options["output"]) == uploaded
    assert (options["repo"], options["base"], options["head"]) == ("/work/templates", "1" * 40, "2" * 40)
    assert options["server"] == server
    assert options["max_cost_per_hour"] is not None


def test_a_wrong_option_does_not_parse() -> None:
    """The parser is the command's own: an option it does not have is refused."""
    line, _ = _github()
    with pytest.raises(CommandError, match="unrecognized arguments"):
        _parsed(line.replace("--max-cost-per-hour 5", "--max-cost-per-day 5"), server=None)
