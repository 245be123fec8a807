"""Two refreshes of request rollups at once, over other minutes of the same hour (the minute task and a
merge of a proposed server, or a task run outlasting its minute): the second waits for the first, and
the hour ends up as its minutes summed. Before they were serialized, the second's DELETE of the hour
missed the first's new rows and its INSERT failed on them (IntegrityError on hour_rollup_identity)."""

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Sum

from app.fleet.models import Server
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import HourRollup, MinuteRollup, RequestRecord, ServerRequestHour
from app.traffic.services.partitions import ensure_day_partitions
from tests.support.sessions import wait_for_lock_waits

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _in_a_thread(work: Callable[[], None], failures: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as failure:  # noqa: BLE001 - handed to the test, which asserts on it
            failures.append(failure)
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_second_refresh_of_the_same_hour_waits_for_the_first_and_the_hour_sums_its_minutes() -> None:
    server = Server.objects.create(name="vllm-a", base_url="http://a:8000")
    arrivals = [HOUR + timedelta(minutes=minute, seconds=5) for minute in (5, 6, 40, 41)]
    ensure_day_partitions(RequestRecord, arrivals)
    RequestRecord.objects.bulk_create(
        RequestRecord(server=server, request_id=f"r{n}", arrived_at=at, source="rest",
                      prompt_tokens=1000 + n, cached_tokens=100 * n)
        for n, at in enumerate(arrivals)
    )  # fmt: skip
    refresh_minute_rollups(since=HOUR, until=HOUR + timedelta(hours=1))  # the hour's rows exist

    first_may_commit = threading.Event()
    failures: list[BaseException] = []

    def first() -> None:  # the early minutes, its transaction held open
        with transaction.atomic():
            refresh_minute_rollups(since=HOUR + timedelta(minutes=5), until=HOUR + timedelta(minutes=7))
            assert first_may_commit.wait(30)

    def second() -> None:  # the late minutes of the same hour
        refresh_minute_rollups(since=HOUR + timedelta(minutes=40), until=HOUR + timedelta(minutes=42))

    holder = _in_a_thread(first, failures)
    for _ in range(500):  # until the first has refreshed and holds its transaction open
        if _first_holds_its_transaction():
            break
        time.sleep(0.02)
    waiter = _in_a_thread(second, failures)
    wait_for_lock_waits(1)  # the second waits for the first
    first_may_commit.set()
    holder.join(30)
    waiter.join(30)

    assert failures == []
    assert HourRollup.objects.get(server=server, hour=HOUR).requests == 4
    summed = MinuteRollup.objects.aggregate(prompt=Sum("prompt_tokens"), cached=Sum("cached_tokens"))
    hour = ServerRequestHour.objects.get(server=server, hour=HOUR)
    assert (hour.requests, hour.prompt_tokens, hour.cached_tokens) == (4, summed["prompt"], summed["cached"])
    assert summed == {"prompt": 4006, "cached": 600}


def _first_holds_its_transaction() -> bool:
    """Whether another session sits idle in a transaction (the first refresh, done, not committed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
        )
        return bool(cursor.fetchone()[0])
