from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from app.traffic.services import requests, rollups

# Late records (a gateway replaying its spill file) land within this window of their minute.
ROLLUP_LOOKBACK = timedelta(minutes=15)


@shared_task(name="traffic.refresh_rollups")
def refresh_rollups() -> None:
    now = timezone.now()
    rollups.refresh_minute_rollups(since=now - ROLLUP_LOOKBACK, until=now)


@shared_task(name="traffic.expire_token_ids")
def expire_token_ids() -> None:
    requests.expire_token_ids(now=timezone.now())
