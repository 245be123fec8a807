"""The webhook told of the demo's `volatile_top` regression when it opens and when its revert resolves
it, on a real HTTP server on the loopback; transient failures tried again, the others not, the
detection never held up, and the webhook's secret URL never logged."""

import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from pytest_django import Settings

from app.celery import celery_app
from app.regressions import hooks, webhook
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from app.regressions.tasks import notify_webhook
from tests.regressions.test_detection import demo, fault_commit
from tests.support.tokens import reader_bearer
from tests.support.virtual_fleet import VirtualRun, run_virtually
from tests.support.webhook_server import SECRET_PATH, Answer, Webhook, running_webhook

pytestmark = pytest.mark.django_db(transaction=True)
SITE = "https://prefixscope.example"


@pytest.fixture
def hook(settings: Settings) -> Iterator[Webhook]:
    """The webhook set, and queued tasks run at once, in the test (as tests/prompts/conftest.py's
    `eager`): a retry runs again at once, its countdown not waited for."""
    with running_webhook() as running:
        settings.PREFIXSCOPE_REGRESSION_WEBHOOK_URL = running.url
        settings.PREFIXSCOPE_REGRESSION_WEBHOOK_TIMEOUT_SECONDS = 2
        settings.PREFIXSCOPE_BASE_URL = SITE + "/"
        celery_app.conf.task_always_eager = True
        try:
            yield running
        finally:
            celery_app.conf.task_always_eager = False


def reverted_demo() -> dict[str, Any]:
    """volatile_top on `support` at minute 5, reverted to the template's own text at minute 10."""
    original = next(t["text"] for t in demo()["templates"] if t["name"] == "support")
    revert = {
        "at": 600,
        "template": "support",
        "change": {"text": original, "message": "Revert the time line"},
    }
    return demo(duration=1080, timeline=[demo()["timeline"][0], revert])


def detected(definition: dict[str, Any], tmp_path: Path) -> VirtualRun:
    return run_virtually(definition, tmp_path, every_minute=lambda now: detect_regressions(now=now))


def test_the_webhook_hears_of_the_regression_opened_and_resolved_once_each(
    hook: Webhook, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    hook.answers = [Answer(500)]  # the first attempt fails; the next one, at once here, is taken
    run = detected(reverted_demo(), tmp_path)

    regression = Regression.objects.get(scope="template", template__name="support")
    assert regression.state == Regression.State.RESOLVED
    opened, again, resolved = hook.received  # the 500's, its retry, and the resolution's
    assert opened == again
    sha = fault_commit(run, "support", 300)
    sentence = opened["blocks"][0]["text"]["text"]
    assert sentence.startswith(f"Regression opened on template `support`: since commit `{sha[:7]}` of ")
    assert "“support: show the current time and request id at the top of the prompt”" in sentence
    assert f"its requests diverge at token {regression.evidence['pair']['diverged_at']}" in sentence
    assert (
        f"reuse fell from {regression.rate_before * 100:.0f} % to {regression.rate_after * 100:.0f} %"
        in sentence
    )
    assert "GPU-seconds an hour at " in sentence and "tokens/s (measured)" in sentence
    link = f"{SITE}/regressions/{regression.pk}/"
    assert opened["text"] == f"{sentence} <{link}|Regression {regression.pk}>"
    assert f"<{link}|Regression {regression.pk}>" in opened["blocks"][1]["elements"][0]["text"]
    assert resolved["blocks"][0]["text"]["text"].startswith(
        f"Regression resolved on template `support` (since commit `{sha[:7]}` of "
    )
    assert f"reuse is back at {regression.rate_now * 100:.0f} %" in resolved["text"]

    sent = regression.evidence["webhook"]
    assert (sent["opened"]["outcome"], sent["opened"]["attempts"], sent["opened"]["detail"]) == (
        "sent",
        2,
        "HTTP 200",
    )
    assert (sent["resolved"]["outcome"], sent["resolved"]["attempts"]) == ("sent", 1)
    bearer = reader_bearer()
    served = Client().get(f"/api/v1/regressions/{regression.pk}", headers=bearer).json()["webhook"]
    assert (served["opened"]["outcome"], served["resolved"]["detail"]) == ("sent", "HTTP 200")
    assert "regression" in caplog.text and SECRET_PATH not in caplog.text and "SECRET" not in caplog.text


def test_a_refusal_is_not_tried_again_and_holds_nothing_up(hook: Webhook, tmp_path: Path) -> None:
    hook.answers = [Answer(404)]
    detected(demo(duration=540, timeline=demo()["timeline"][:1]), tmp_path)

    regression = Regression.objects.get()  # opened all the same
    assert len(hook.received) == 1
    assert regression.evidence["webhook"]["opened"] | {"at": None} == {
        "outcome": "failed", "detail": "HTTP 404: no_service", "attempts": 1, "at": None,
    }  # fmt: skip

    hook.answers = [Answer(500)] * webhook.MAX_ATTEMPTS
    notify_webhook.apply(args=(regression.pk, "opened"))
    assert len(hook.received) == 1 + webhook.MAX_ATTEMPTS  # every attempt made, then given up
    regression.refresh_from_db()
    assert regression.evidence["webhook"]["opened"]["outcome"] == "failed"
    assert regression.evidence["webhook"]["opened"]["attempts"] == webhook.MAX_ATTEMPTS

    # A run over history (detect_regressions --since) notifies nobody of what it resolves.
    hooks.regression_resolved(regression, now=timezone.now() - timedelta(hours=2))
    assert len(hook.received) == 1 + webhook.MAX_ATTEMPTS


def test_no_webhook_set_no_notice(settings: Settings, tmp_path: Path) -> None:
    settings.PREFIXSCOPE_REGRESSION_WEBHOOK_URL = ""
    detected(demo(duration=540, timeline=demo()["timeline"][:1]), tmp_path)
    assert "webhook" not in Regression.objects.get().evidence
