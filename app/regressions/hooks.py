"""What follows a regression's opening and its updates, once the detection has saved it: its
evidence's killers frozen (while it is open) and the webhook told (when it opens and resolves).

The detection (services.py) calls these after each save; anything else that resolves a regression
calls ``regression_resolved`` after saving it.
"""

from datetime import datetime

from app.regressions import evidence, webhook
from app.regressions.models import Regression


def regression_opened(regression: Regression, *, now: datetime) -> None:
    evidence.freeze_killers(regression, now=now)
    webhook.queue_notice(regression, "opened", now=now)


def regression_updated(regression: Regression, *, now: datetime) -> None:
    """An active regression the detection updated: resolved by this update, or still open."""
    if regression.state == Regression.State.RESOLVED:
        regression_resolved(regression, now=now)
    else:
        evidence.freeze_killers(regression, now=now)


def regression_resolved(regression: Regression, *, now: datetime) -> None:
    webhook.queue_notice(regression, "resolved", now=now)
