from celery import shared_task
from django.utils import timezone

from app.core import services


@shared_task(name="core.maintain_partitions")
def maintain_partitions() -> None:
    services.maintain_partitions(now=timezone.now())
