"""A what-if question kept, answered by its task with progress, and read back."""

from pathlib import Path

import pytest

import app.whatif.tasks  # noqa: F401 - registers the task a question queues (eager here)
from app.core.tenancy import SEES_ALL, Viewer
from app.whatif.models import WhatIfQuestion
from app.whatif.questions import answers_of, queue
from app.whatif.services import Scope, ScopeKind, ask
from tests.support.virtual_fleet import run_virtually
from tests.whatif.test_ask import demo

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def test_a_question_is_answered_by_its_task_and_its_answers_read_back(tmp_path: Path) -> None:
    run = run_virtually(demo(180), tmp_path, scrape_every=15)
    since, until = run.at(0), run.at(181)

    question = queue(
        scope=Scope(ScopeKind.FLEET), since=since, until=until, viewer=SEES_ALL, asked_by_id=None
    )

    question.refresh_from_db()
    assert question.state == WhatIfQuestion.State.DONE and question.progress == 1.0
    assert answers_of(question) == ask(scope=Scope(ScopeKind.FLEET), since=since, until=until).answers


def test_a_question_with_nothing_to_replay_fails_with_its_reason(tmp_path: Path) -> None:
    run = run_virtually(demo(60), tmp_path, scrape_every=15)

    question = queue(
        scope=Scope(ScopeKind.TEMPLATE, "support"), since=run.at(0), until=run.at(61),
        viewer=Viewer(tenants=frozenset({"nobody"})), asked_by_id=None,
    )  # fmt: skip

    question.refresh_from_db()
    assert question.state == WhatIfQuestion.State.FAILED
    assert question.error == "no request of template support to replay in the window"
    assert answers_of(question) is None
