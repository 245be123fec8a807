"""A regression's log lines say at a glance what opened or resolved: the scope, its figures before and
after, the suspect commit, the resolution.

app/regressions/lifecycle.py logs "regression opened" / "regression resolved" / "regression open
again" with the regression's id in `extra`; settings.LOGGING puts `RegressionSummary` on its logger,
which appends the summary to the message, so every handler prints it (JSON logs, the Celery worker's
own format, and `make run`'s console, which shows these lines and little else: app/devstack.py).
"""

import logging

logger = logging.getLogger(__name__)


class RegressionSummary(logging.Filter):
    """Appends the regression's summary to a lifecycle record that names one; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        regression = getattr(record, "regression", None)
        message = record.msg
        if isinstance(regression, int) and isinstance(message, str) and message.startswith("regression"):
            summary = regression_summary(regression)
            resolution = getattr(record, "resolution", "")
            if summary:
                record.msg = f"{message} ({resolution}): {summary}" if resolution else f"{message}: {summary}"
        return True


def regression_summary(pk: int) -> str:
    """E.g. "template support: 95% -> 29%, Template commit, suspect 1a2b3c4 (support: show the
    current time ...)"; "" when the row cannot be read."""
    from django.db import DatabaseError, transaction

    from app.regressions.models import Regression

    try:
        # A savepoint: a failed read must not abort the transaction of the code that logged.
        with transaction.atomic():
            found = (
                Regression.objects.select_related("template", "server", "suspect_version")
                .filter(pk=pk)
                .first()
            )
    except DatabaseError:
        logger.debug("regression %s not read for its log line", pk, exc_info=True)
        return ""
    if found is None:
        return ""
    parts = [str(found), found.kind_label]
    if found.suspect_version is not None:
        subject = found.suspect_version.message.strip().splitlines()[:1]
        parts.append(
            f"suspect {found.suspect_version.commit_sha[:7]}" + (f" ({subject[0]})" if subject else "")
        )
    return ", ".join(parts)
