from celery import shared_task
from django.utils import timezone

from app.compare import services


@shared_task(name="compare.expire_token_ids")
def expire_token_ids() -> None:
    services.expire_token_ids(now=timezone.now())
