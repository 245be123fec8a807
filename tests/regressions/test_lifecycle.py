"""How a regression ends: its suspect reverted, its scope idle (and back, still regressed), on the demo's
`volatile_top` commit stored and diagnosed as a deployment does it."""

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings

from app.prompts.models import TemplateVersion
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from tests.regressions.test_detection import demo, detected, fault_commit
from tests.support.virtual_fleet import run_virtually

pytestmark = pytest.mark.django_db(transaction=True)

Resolution, State = Regression.Resolution, Regression.State
VOLATILE_TOP = demo()["timeline"][0]  # on `support` at minute 5
SUPPORT_TEXT = next(t["text"] for t in demo()["templates"] if t["name"] == "support")


def test_a_reverted_suspect_resolves_its_regression_as_reverted(tmp_path: Path) -> None:
    revert = {
        "at": 600,
        "template": "support",
        "change": {"message": "Revert: time at the top", "text": SUPPORT_TEXT},
    }
    run = detected(demo(duration=840, timeline=[VOLATILE_TOP, revert]), tmp_path)

    [support] = Regression.objects.filter(template__name="support")
    assert support.suspect_version == TemplateVersion.objects.get(
        commit_sha=fault_commit(run, "support", 300)
    )
    assert (support.state, support.resolution) == (State.RESOLVED, Resolution.REVERTED)
    assert support.resolved_at is not None
    assert run.at(600) < support.resolved_at <= run.at(600) + timedelta(minutes=3)


def test_an_edit_that_is_no_revert_leaves_it_open(tmp_path: Path) -> None:
    # Still the time at the top: another commit, not the text before the suspect.
    text = "Current time: {{ now }}\n" + SUPPORT_TEXT + "9. Never promise a delivery date.\n"
    other = {
        "at": 600,
        "template": "support",
        "change": {"message": "support: one more policy", "text": text},
    }
    detected(demo(duration=840, timeline=[VOLATILE_TOP, other]), tmp_path)

    [support] = Regression.objects.filter(template__name="support")
    assert support.state == State.OPEN and support.resolution == ""


def test_an_idle_scope_resolves_its_regression_and_opens_it_again_if_it_comes_back_regressed(
    tmp_path: Path, settings: Settings
) -> None:
    settings.PREFIXSCOPE_REGRESSION_WINDOW_MINUTES = 10
    states: list[tuple[datetime, str, str]] = []

    def every_minute(now: datetime) -> Any:
        detect_regressions(now=now)
        support = Regression.objects.filter(template__name="support").first()
        if support is not None:
            states.append((now, support.state, support.resolution))

    # `support` sends nothing from minute 10 to minute 22, then comes back with its volatile top.
    run = run_virtually(
        demo(duration=1620, timeline=[VOLATILE_TOP]),
        tmp_path,
        every_minute=every_minute,
        keep=lambda request: request.template != "support" or not 600 <= request.at < 1320,
    )

    idle = [now for now, state, resolution in states if resolution == Resolution.IDLE]
    assert idle, states
    # Resolved once the window (10 minutes) held none of its minutes, not before.
    assert run.at(600) + timedelta(minutes=10) <= idle[0] <= run.at(600) + timedelta(minutes=12)
    assert all(state == State.OPEN for now, state, _ in states if now < idle[0])
    [support] = Regression.objects.filter(template__name="support")
    assert (support.state, support.resolution, support.resolved_at) == (State.OPEN, "", None)
    assert support.rate_now < 0.5 < support.rate_before
