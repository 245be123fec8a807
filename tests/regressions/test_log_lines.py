"""A regression's log lines name the scope, its figures and the suspect commit (`make run`'s console
shows them, and little else)."""

import logging
from pathlib import Path

import pytest

from tests.regressions.test_detection import demo, detected, fault_commit
from tests.regressions.test_lifecycle import SUPPORT_TEXT, VOLATILE_TOP

pytestmark = pytest.mark.django_db(transaction=True)


def test_opened_and_resolved_lines_say_which_by_how_much_and_the_suspect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    revert = {"at": 600, "template": "support", "change": {"message": "Revert", "text": SUPPORT_TEXT}}
    with caplog.at_level(logging.INFO, logger="app.regressions.lifecycle"):
        run = detected(demo(duration=840, timeline=[VOLATILE_TOP, revert]), tmp_path)

    lines = [r.getMessage() for r in caplog.records if r.name == "app.regressions.lifecycle"]
    sha = fault_commit(run, "support", 300)[:7]
    opened = [line for line in lines if line.startswith("regression opened: template support: ")]
    assert len(opened) == 1, lines
    assert f"Template commit, suspect {sha} (support: show the current time" in opened[0], opened
    before, after = opened[0].split(": ")[2].split(",")[0].split(" -> ")
    assert int(before.rstrip("%")) > 80 > 40 > int(after.rstrip("%")), opened
    resolved = [
        line for line in lines if line.startswith("regression resolved (reverted): template support: ")
    ]
    assert len(resolved) == 1 and sha in resolved[0], lines
