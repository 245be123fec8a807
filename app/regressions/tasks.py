from celery import shared_task
from celery.app.task import Task
from django.utils import timezone

from app.regressions import webhook
from app.regressions.services import check_deploys as check_deploys_now
from app.regressions.services import detect_regressions


@shared_task(name="regressions.detect")
def detect() -> int:
    """One run of the detection over the latest minutes (every minute, Celery beat)."""
    return detect_regressions(now=timezone.now())


@shared_task(name="regressions.check_deploys")
def check_deploys() -> int:
    """The template versions that went live lately, each against the one before it (beat, every
    PREFIXSCOPE_DEPLOY_CHECK_SECONDS)."""
    return check_deploys_now(now=timezone.now())


@shared_task(name=webhook.NOTIFY_TASK, bind=True, max_retries=webhook.MAX_ATTEMPTS - 1)
def notify_webhook(self: Task[[int, str], None], regression_id: int, event: str) -> None:
    """Tell the webhook a regression opened or resolved; again later while the failure is transient."""
    retries, last = self.request.retries, self.request.retries >= webhook.MAX_ATTEMPTS - 1
    try:
        webhook.deliver_notice(regression_id=regression_id, event=event, attempt=retries + 1, last=last,
                               now=timezone.now())  # fmt: skip
    except webhook.DeliveryFailed as failure:
        raise self.retry(countdown=webhook.retry_delay(failure, retries=retries)) from None
