from celery import shared_task
from django.utils import timezone

from app.compare import killers, services


@shared_task(name="compare.expire_token_ids")
def expire_token_ids() -> None:
    services.expire_token_ids(now=timezone.now())


@shared_task(name="compare.find_killers")
def find_killers() -> None:
    """Replace every template's cache killers with those of its last window of traffic."""
    killers.find_all_killers(now=timezone.now())
