"""The webhook told of each regression opened and resolved: Slack-compatible JSON (``text``, and
``blocks`` that say it better), POSTed by the task ``regressions.notify_webhook``, queued once the
detection's write is committed, so a slow or failing webhook never holds the detection up.

Timeouts, network errors, 5xx, 408 and 429 are tried again with backoff (429's and 503's Retry-After
honoured), other answers not: a 4xx is the URL or the payload, which another try will not change.
Each attempt's outcome is kept in the regression's ``evidence["webhook"]``, by event.

PREFIXSCOPE_REGRESSION_WEBHOOK_URL is a secret (Slack's carry their token in the path): it is read
by the worker, never passed to a task or written to a log or to the outcome.
"""

import logging
import re
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from app.regressions import evidence
from app.regressions.models import Regression

logger = logging.getLogger(__name__)

EVENTS = ("opened", "resolved")
NOTIFY_TASK = "regressions.notify_webhook"  # app/regressions/tasks.py
MAX_ATTEMPTS = 7  # 15 s, 30 s, ... 8 min apart: about 16 minutes in all
FIRST_DELAY_SECONDS = 15
MAX_DELAY_SECONDS = 3600  # a Retry-After longer than an hour is not waited for in full
RETRYABLE_STATUSES = frozenset({408, 429})  # and every 5xx
ERROR_CODE = re.compile(r"[a-z_]{1,40}")
HISTORY = timedelta(minutes=15)
"""A detection run whose `now` is older than this ran over history (detect_regressions --since):
what it opens and resolves is old news, and notifies nobody."""


class DeliveryFailed(Exception):
    """The webhook did not take the notice; ``retryable`` when another try may help."""

    def __init__(self, reason: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason, self.retryable, self.retry_after = reason, retryable, retry_after


def queue_notice(regression: Regression, event: str, *, now: datetime) -> None:
    """Queue the notice of ``event`` once the transaction in progress commits (at once outside one).
    Nothing when no webhook is set, or for a detection run over history. A broker that is away
    loses the notice (its outcome says so): the detection goes on."""
    if not settings.PREFIXSCOPE_REGRESSION_WEBHOOK_URL:
        return
    if timezone.now() - now > HISTORY:
        logger.info("regression %s %s over history: no notice", regression.pk, event)
        return
    transaction.on_commit(lambda: _enqueue(regression.pk, event), robust=True)


def _enqueue(regression_id: int, event: str) -> None:
    # By the task's name, not its function: the tasks import the services that call this module.
    # A signature runs the task registered in this process (eager in tests), else sends it by name.
    notice = current_app.signature(NOTIFY_TASK, args=(regression_id, event))
    try:  # retry=False: a broker that is away fails at once, not after the detection waited
        notice.apply_async(retry=False)
    except BrokerUnavailable:
        logger.warning("regression %s %s: notice not queued, the broker is away", regression_id, event)
        _record(regression_id, event, "not queued", "the broker was away", attempt=0, now=timezone.now())


def deliver_notice(
    *,
    regression_id: int,
    event: str,
    attempt: int,
    last: bool,
    now: datetime,
    client: httpx.Client | None = None,
) -> None:
    """POST the notice of a regression's ``event`` (attempt number ``attempt``) and keep its outcome.
    Raises DeliveryFailed when it failed, another try may help and this attempt is not the ``last``.
    A regression deleted or a webhook unset since it was queued: nothing is sent."""
    url = settings.PREFIXSCOPE_REGRESSION_WEBHOOK_URL
    related = Regression.objects.select_related("template", "server", "suspect_version")
    regression = related.filter(pk=regression_id).first()
    if regression is None or not url:
        return
    try:
        with nullcontext(client) if client is not None else httpx.Client() as http:
            status = post_notice(http, url, notice(regression, event), now=now)
    except DeliveryFailed as failure:
        again = failure.retryable and not last
        _record(
            regression_id, event, "retrying" if again else "failed", failure.reason, attempt=attempt, now=now
        )
        logger.warning(
            "regression %s %s notice: %s (attempt %d)", regression_id, event, failure.reason, attempt
        )
        if again:
            raise
        return
    _record(regression_id, event, "sent", f"HTTP {status}", attempt=attempt, now=now)
    logger.info("regression %s %s notice sent (attempt %d)", regression_id, event, attempt)


def post_notice(client: httpx.Client, url: str, payload: dict[str, Any], *, now: datetime) -> int:
    """The 2xx status the webhook answered the notice with; DeliveryFailed otherwise (its reason
    names neither the URL nor anything the exception of a failed connection may quote of it)."""
    timeout = settings.PREFIXSCOPE_REGRESSION_WEBHOOK_TIMEOUT_SECONDS
    try:
        response = client.post(url, json=payload, timeout=timeout)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol):
        raise DeliveryFailed("not an http(s) URL", retryable=False) from None
    except httpx.TimeoutException:
        raise DeliveryFailed(f"timed out after {timeout:g} s", retryable=True) from None
    except httpx.TransportError as exc:
        raise DeliveryFailed(exc.__class__.__name__, retryable=True) from None
    if response.is_success:
        return response.status_code
    status = response.status_code
    retryable = status >= 500 or status in RETRYABLE_STATUSES
    # Slack says why in a word (invalid_payload, no_service); another server's page may quote the URL.
    said = response.text.strip()
    reason = f"HTTP {status}" + (f": {said}" if ERROR_CODE.fullmatch(said) else "")
    after = retry_after(response.headers.get("retry-after"), now=now) if retryable else None
    raise DeliveryFailed(reason, retryable=retryable, retry_after=after)


def retry_after(value: str | None, *, now: datetime) -> float | None:
    """Seconds a Retry-After header asks to wait (a number of seconds or an HTTP date), at most
    MAX_DELAY_SECONDS; None when absent or unreadable."""
    if not value:
        return None
    try:
        seconds = (
            float(value) if value.strip().isdigit() else (parsedate_to_datetime(value) - now).total_seconds()
        )
    except (TypeError, ValueError):
        return None
    return min(max(seconds, 0.0), MAX_DELAY_SECONDS)


def retry_delay(failure: DeliveryFailed, *, retries: int) -> float:
    """How long to wait before the next attempt: what the webhook asked for, else doubling from
    FIRST_DELAY_SECONDS after each retry."""
    if failure.retry_after is not None:
        return failure.retry_after
    return float(min(FIRST_DELAY_SECONDS * 2**retries, MAX_DELAY_SECONDS))


def _record(
    regression_id: int, event: str, outcome: str, detail: str, *, attempt: int, now: datetime
) -> None:
    shown = {"outcome": outcome, "detail": detail, "attempts": attempt, "at": now.astimezone(UTC).isoformat()}
    evidence.store_evidence(regression_id, "webhook", lambda kept: {**(kept or {}), event: shown})


def notice(regression: Regression, event: str) -> dict[str, Any]:
    """The Slack-compatible notice: the sentence that says what happened, and a link to its page."""
    link = settings.PREFIXSCOPE_BASE_URL.rstrip("/") + reverse("regressions:detail", args=[regression.pk])
    sentence = _opened(regression) if event == "opened" else _resolved(regression)
    label = f"<{link}|Regression {regression.pk}>"
    details = f"{label} · {regression.get_kind_display()} · confidence {regression.confidence:.4f}"
    return {
        "text": f"{sentence} {label}",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": sentence}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": details}]},
        ],
    }


def _opened(regression: Regression) -> str:
    """Since commit 3f2a1c0 of `support.j2` (...), requests of template `support` diverge at token 7
    (a timestamp); reuse fell from 91 % to 4 %; ... tokens, GPU-seconds and money an hour."""
    expected = " Expected: it closes once the cache is warm again." if regression.expected else ""
    return (
        f"Regression opened on {_scope(regression)}: {_cause(regression)}{_divergence(regression)}; "
        f"{_change(regression)}; {_cost(regression)}.{expected}"
    )


def _change(regression: Regression) -> str:
    before, after = regression.rate_before, regression.rate_after
    if regression.metric == Regression.Metric.HIT_RATE:
        return f"reuse fell from {_percent(before)} to {_percent(after)}"
    return f"{regression.get_metric_display()} went from {before:.3g} to {after:.3g}"


def _resolved(regression: Regression) -> str:
    hit_rate = regression.metric == Regression.Metric.HIT_RATE
    what, shown = ("reuse", _percent) if hit_rate else (regression.get_metric_display(), "{:.3g}".format)
    return (
        f"Regression resolved on {_scope(regression)} ({_cause(regression)}): {what} is back at "
        f"{shown(regression.rate_now)}, from {shown(regression.rate_after)} after the change "
        f"and {shown(regression.rate_before)} before it."
    )


def _scope(regression: Regression) -> str:
    if regression.scope == Regression.Scope.FLEET:
        return "the fleet"
    return f"{regression.get_scope_display().lower()} `{_escape(regression.scope_label)}`"


def _cause(regression: Regression) -> str:
    version = regression.suspect_version
    if version is None:
        return f"a {regression.get_kind_display().lower()} since {regression.changed_at:%Y-%m-%d %H:%M} UTC"
    message = _escape(version.message.strip().splitlines()[0] if version.message.strip() else "no message")
    where = f" of `{_escape(version.path)}`" if version.path else ""
    when = f"{version.committed_at:%Y-%m-%d %H:%M} UTC"
    return f"since commit `{version.commit_sha[:7]}`{where} ({when}, “{message}”)"


def _divergence(regression: Regression) -> str:
    """Where the pair's after request departs, and the killer frozen there, if one is."""
    diverged = regression.evidence.get("pair", {}).get("diverged_at")
    if diverged is None:
        return ""
    killers = [frozen.killer for frozen in evidence.frozen_killers(regression)]
    near = [
        k for k in killers if k.position_token is not None and abs(k.position_token - diverged) < k.block_size
    ]
    there = f" ({near[0].get_kind_display().lower()})" if near else ""
    return f", its requests diverge at token {diverged}{there}"


def _cost(regression: Regression) -> str:
    return (
        f"{regression.lost_tokens_per_hour:,.0f} prefill tokens an hour lost over its rate before, "
        f"{regression.gpu_seconds_per_hour:,.1f} GPU-seconds an hour at "
        f"{regression.prefill_tokens_per_second:,.0f} tokens/s ({regression.prefill_rate_source}), "
        f"${regression.cost_per_hour:,.2f} an hour"
    )


def _percent(rate: float) -> str:
    return f"{rate * 100:.0f} %"


def _escape(text: str) -> str:
    """Text shown as is in Slack's mrkdwn (which reads &, < and > as markup)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
