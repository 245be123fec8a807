from celery import shared_task
from django.utils import timezone

from app.regressions.services import detect_regressions


@shared_task(name="regressions.detect")
def detect() -> int:
    """One run of the detection over the latest whole minutes (every minute, Celery beat)."""
    return detect_regressions(now=timezone.now())
