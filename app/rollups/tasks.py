from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from app.rollups.refresh import refresh_minute_rollups
from app.rollups.servers import refresh_server_minutes

# Late records (a gateway replaying its spill file) land within this window of their minute.
ROLLUP_LOOKBACK = timedelta(minutes=15)


@shared_task(name="rollups.refresh_rollups")
def refresh_rollups() -> None:
    now = timezone.now()
    refresh_minute_rollups(since=now - ROLLUP_LOOKBACK, until=now)
    refresh_server_minutes(since=now - ROLLUP_LOOKBACK, until=now)
