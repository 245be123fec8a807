"""What-if questions kept in the database: asked (queued for the task), answered with progress,
read back. The page, the API and `manage.py whatif` all go through here."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import msgspec
from celery import current_app
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from app.core.tenancy import Viewer
from app.domain.replay.whatif import WhatIf
from app.whatif.models import WhatIfQuestion
from app.whatif.results import from_json, to_json
from app.whatif.services import NothingToReplay, Scope, ScopeKind, ask

logger = logging.getLogger(__name__)
ANSWER_TASK = "whatif.answer"  # app/whatif/tasks.py
UNANSWERED_AFTER = timedelta(minutes=30)
"""A question queued or running this long has lost its worker (a day's window replays in minutes)."""
PROGRESS_STEP = 0.05  # the row is written when progress moved this much


def queue(
    *, scope: Scope, since: datetime, until: datetime, viewer: Viewer, asked_by_id: int | None
) -> WhatIfQuestion:
    """Keep the question and queue the task that answers it (after the row is committed)."""
    if until <= since:
        raise ValueError("the window must end after it starts")
    question = WhatIfQuestion.objects.create(
        scope=scope.kind.value, name=scope.name, since=since, until=until, asked_by_id=asked_by_id,
        tenants=None if viewer.tenants is None else sorted(viewer.tenants),
    )  # fmt: skip
    transaction.on_commit(lambda: _enqueue(question.pk), robust=True)
    return question


def _enqueue(question_id: int) -> None:
    # By the task's name: the task module imports this one. A signature runs the task registered in
    # this process (eager in tests), else sends it by name.
    task = current_app.signature(ANSWER_TASK, args=(question_id,))
    try:
        task.apply_async(retry=False)
    except BrokerUnavailable:
        logger.warning("what-if %s not queued: the broker is away", question_id)
        WhatIfQuestion.objects.filter(pk=question_id).update(
            state=WhatIfQuestion.State.FAILED,
            error="not queued: the task broker was away",
            finished_at=timezone.now(),
        )


def answer(*, question_id: int) -> None:
    """Compute a queued question's answers and keep them; a question that cannot be answered ends
    failed with the reason (a scope with nothing to replay). Already answered: nothing to do."""
    question = WhatIfQuestion.objects.filter(pk=question_id).first()
    if question is None or question.state == WhatIfQuestion.State.DONE:
        return
    _set(question, state=WhatIfQuestion.State.RUNNING, progress=0.0)
    written = [0.0]

    def progress(share: float) -> None:
        if share - written[0] >= PROGRESS_STEP or share == 1.0:
            written[0] = share
            _set(question, progress=share)

    try:
        asked = ask(
            scope=scope_of(question), since=question.since, until=question.until, viewer=viewer_of(question),
            progress=progress,
        )  # fmt: skip
    except NothingToReplay as exc:
        _set(question, state=WhatIfQuestion.State.FAILED, error=str(exc), finished_at=timezone.now())
        return
    except Exception:
        # A fault of the replay's, not of the question: said on it, not left running forever.
        logger.exception("what-if %s failed", question.pk)
        error = "the replay failed; the worker's log says why"
        _set(question, state=WhatIfQuestion.State.FAILED, error=error, finished_at=timezone.now())
        raise
    _set(
        question, state=WhatIfQuestion.State.DONE, progress=1.0, answers=to_json(asked.answers),
        finished_at=timezone.now(),
    )  # fmt: skip
    logger.info("what-if %s answered: %d requests", question.pk, asked.answers.requests)


def settled(question: WhatIfQuestion, *, now: datetime) -> WhatIfQuestion:
    """The question, failed with the reason when no worker has finished it within UNANSWERED_AFTER
    (a worker stopped, or none runs): said, rather than polled for ever."""
    waiting = question.state in (WhatIfQuestion.State.QUEUED, WhatIfQuestion.State.RUNNING)
    if waiting and now - question.asked_at > UNANSWERED_AFTER:
        minutes = int(UNANSWERED_AFTER.total_seconds() // 60)
        error = f"no worker answered it within {minutes} minutes: is the Celery worker running?"
        _set(question, state=WhatIfQuestion.State.FAILED, error=error, finished_at=now)
    return question


def answers_of(question: WhatIfQuestion) -> WhatIf | None:
    """The question's answers, None until it is done (or when kept in a shape this version does not
    read: the page asks again)."""
    if question.answers is None:
        return None
    try:
        return from_json(question.answers)
    except msgspec.ValidationError:
        # Kept by a version whose answers had another shape: not read, asked again where shown.
        logger.warning("what-if %s: its kept answers are of an older shape", question.pk)
        return None


def scope_of(question: WhatIfQuestion) -> Scope:
    return Scope(ScopeKind(question.scope), question.name)


def viewer_of(question: WhatIfQuestion) -> Viewer:
    return Viewer(tenants=None if question.tenants is None else frozenset(question.tenants))


def _set(question: WhatIfQuestion, **fields: object) -> None:
    for name, value in fields.items():
        setattr(question, name, value)
    WhatIfQuestion.objects.filter(pk=question.pk).update(**fields)
