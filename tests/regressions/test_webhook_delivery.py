"""One POST of a notice to a webhook on the loopback: which failures are tried again, and when."""

from datetime import UTC, datetime

import httpx
import pytest
from pytest_django import Settings

from app.regressions import webhook
from tests.support.webhook_server import SECRET_PATH, Answer, running_webhook

NOW = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("answer", "retryable", "retry_after", "reason"),
    [
        (Answer(429, {"Retry-After": "7"}), True, 7.0, "HTTP 429: no_service"),
        (Answer(503, {"Retry-After": "Wed, 02 Dec 2026 06:01:00 GMT"}), True, 60.0, "HTTP 503: no_service"),
        (Answer(502), True, None, "HTTP 502: no_service"),
        (Answer(408), True, None, "HTTP 408: no_service"),
        (Answer(400, body=b"invalid_payload"), False, None, "HTTP 400: invalid_payload"),
        # A server's own 404 page may quote the path, the secret: not kept.
        (Answer(404, body=f"<p>{SECRET_PATH} was not found</p>".encode()), False, None, "HTTP 404"),
        (Answer(301, {"Location": "https://elsewhere.example/"}), False, None, "HTTP 301: ok"),
    ],
    ids=["429-seconds", "503-date", "502", "408", "400", "404-page", "redirect"],
)
def test_what_is_tried_again_and_when(
    settings: Settings, answer: Answer, retryable: bool, retry_after: float | None, reason: str
) -> None:
    settings.PREFIXSCOPE_REGRESSION_WEBHOOK_TIMEOUT_SECONDS = 2
    with running_webhook() as running, httpx.Client() as client:
        running.answers = [answer]
        with pytest.raises(webhook.DeliveryFailed) as failed:
            webhook.post_notice(client, running.url, {"text": "hello"}, now=NOW)
    assert (failed.value.retryable, failed.value.retry_after, failed.value.reason) == (
        retryable, retry_after, reason,
    )  # fmt: skip
    assert running.received == [{"text": "hello"}]
    expected = retry_after if retry_after is not None else 60.0
    assert webhook.retry_delay(failed.value, retries=2) == expected  # 15 s doubled twice, unless asked


def test_a_slow_or_absent_webhook_is_tried_again(settings: Settings) -> None:
    settings.PREFIXSCOPE_REGRESSION_WEBHOOK_TIMEOUT_SECONDS = 0.2
    with running_webhook() as running, httpx.Client() as client:
        running.answers = [Answer(200, delay_seconds=1)]
        with pytest.raises(webhook.DeliveryFailed) as slow:
            webhook.post_notice(client, running.url, {"text": "hello"}, now=NOW)
        gone = running.url
    with httpx.Client() as client, pytest.raises(webhook.DeliveryFailed) as absent:
        webhook.post_notice(client, gone, {"text": "hello"}, now=NOW)
    assert (slow.value.reason, slow.value.retryable) == ("timed out after 0.2 s", True)
    assert (absent.value.reason, absent.value.retryable) == ("ConnectError", True)
    assert webhook.retry_delay(absent.value, retries=10) == webhook.MAX_DELAY_SECONDS


def test_a_url_that_is_not_http_is_not_tried_again() -> None:
    with httpx.Client() as client, pytest.raises(webhook.DeliveryFailed) as failed:
        webhook.post_notice(client, "ftp://hooks.example/secret", {"text": "hello"}, now=NOW)
    assert (failed.value.reason, failed.value.retryable) == ("not an http(s) URL", False)
