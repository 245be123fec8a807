"""The raw tables: idempotent keys, unsigned hashes, partitions, rollups and token retention."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.fleet.models import Server
from app.prompts.models import Template
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import KVEvent, MinuteRollup, RequestRecord
from app.traffic.services.partitions import maintain_partitions
from app.traffic.services.requests import expire_token_ids

pytestmark = pytest.mark.django_db


@pytest.fixture
def server() -> Server:
    return Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", model="tiny")


def this_minute() -> datetime:
    return timezone.now().replace(second=0, microsecond=0)


def make_request(server: Server, request_id: str, arrived_at: datetime, **fields: object) -> RequestRecord:
    return RequestRecord(server=server, request_id=request_id, arrived_at=arrived_at, source="rest", **fields)


def test_redelivered_request_records_are_stored_once(server: Server) -> None:
    arrived = this_minute()
    records = [make_request(server, "cmpl-1", arrived, prompt_tokens=191, cached_tokens=160)]
    RequestRecord.objects.bulk_create(records, ignore_conflicts=True)
    RequestRecord.objects.bulk_create(records, ignore_conflicts=True)
    assert RequestRecord.objects.filter(server=server, request_id="cmpl-1").count() == 1


def test_block_hashes_above_two_to_the_63_round_trip_unsigned(server: Server) -> None:
    big_hash = 0xFEDC_BA98_7654_3210  # >= 2**63: stored as a negative bigint
    emitted = timezone.now()
    KVEvent.objects.create(
        server=server,
        seq=7,
        event_index=0,
        emitted_at=emitted,
        received_at=emitted,
        kind=KVEvent.Kind.STORED,
        block_hash=big_hash,
        parent_hash=1,
        token_count=32,
        medium="GPU",
    )
    stored = KVEvent.objects.get(server=server, seq=7)
    assert stored.block_hash == big_hash
    assert KVEvent.objects.filter(block_hash=big_hash).count() == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT block_hash FROM traffic_kvevent WHERE seq = 7")
        assert cursor.fetchone()[0] == big_hash - 2**64


def test_a_replayed_kv_event_does_not_duplicate(server: Server) -> None:
    emitted = timezone.now()
    event = KVEvent(
        server=server,
        seq=1,
        event_index=0,
        block_index=0,
        emitted_at=emitted,
        received_at=emitted,
        kind=KVEvent.Kind.REMOVED,
        block_hash=42,
    )
    KVEvent.objects.bulk_create([event], ignore_conflicts=True)
    KVEvent.objects.bulk_create([event], ignore_conflicts=True)
    assert KVEvent.objects.filter(server=server).count() == 1


def partition_names(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
            [table],
        )
        return {row[0] for row in cursor.fetchall()}


def test_partitions_exist_from_yesterday_to_the_days_ahead() -> None:
    maintain_partitions(
        now=timezone.now()
    )  # as beat runs it: a session begun before midnight did for yesterday
    today = timezone.now().date()
    names = partition_names("traffic_requestrecord")
    for offset in range(-1, 4):  # yesterday, today, PREFIXSCOPE_PARTITIONS_AHEAD_DAYS = 3
        day = today + timedelta(days=offset)
        assert f"traffic_requestrecord_{day:%Y_%b_%d}".lower() in names


def test_a_fresh_install_just_after_midnight_keeps_a_record_from_just_before(server: Server) -> None:
    midnight = datetime(2031, 5, 7, tzinfo=UTC)  # a day no partition exists for yet
    maintain_partitions(now=midnight + timedelta(minutes=5))
    make_request(server, "late", midnight - timedelta(minutes=1)).save()
    assert RequestRecord.objects.filter(request_id="late").exists()


def test_partitions_past_retention_are_dropped_with_their_rows_even_after_a_gap(server: Server) -> None:
    # 60 days back, with no partitions between it and today: maintenance was off for weeks.
    old_day = datetime.combine(timezone.now().date() - timedelta(days=60), datetime.min.time(), tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE traffic_requestrecord_old_test PARTITION OF traffic_requestrecord "
            "FOR VALUES FROM (%s) TO (%s)",
            [old_day, old_day + timedelta(days=1)],
        )
    RequestRecord.objects.create(server=server, request_id="old", arrived_at=old_day, source="rest")
    RequestRecord.objects.create(server=server, request_id="new", arrived_at=timezone.now(), source="rest")
    with connection.cursor() as cursor:
        # The test's transaction still holds deferred FK checks on these rows; production
        # maintenance runs in a transaction of its own.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")

    with override_settings(PREFIXSCOPE_REQUEST_RETENTION_DAYS=30):
        changes = maintain_partitions(now=timezone.now())

    assert "traffic_requestrecord_old_test" in changes.dropped
    assert "traffic_requestrecord_old_test" not in partition_names("traffic_requestrecord")
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == ["new"]


def test_a_partition_is_kept_until_its_newest_row_passes_retention() -> None:
    now = timezone.now()
    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE traffic_kvevent_edge_test PARTITION OF traffic_kvevent "
            "FOR VALUES FROM (%s) TO (%s)",
            [day_start - timedelta(days=3), day_start - timedelta(days=2)],
        )
    with override_settings(PREFIXSCOPE_KV_EVENT_RETENTION_DAYS=2):
        assert (
            "traffic_kvevent_edge_test"
            not in maintain_partitions(now=day_start - timedelta(seconds=1)).dropped
        )
        assert "traffic_kvevent_edge_test" in maintain_partitions(now=day_start).dropped


def test_rollups_sum_tokens_and_bucket_ttft_per_server_template_and_minute(server: Server) -> None:
    template = Template.objects.create(name="support-bot")
    minute = this_minute() - timedelta(minutes=2)
    RequestRecord.objects.bulk_create(
        [
            make_request(
                server,
                "a",
                minute + timedelta(seconds=1),
                template=template,
                prompt_tokens=191,
                cached_tokens=160,
                client_ttft_seconds=0.03,
                server_ttft_seconds=0.015,
            ),
            make_request(
                server,
                "b",
                minute + timedelta(seconds=30),
                template=template,
                prompt_tokens=191,
                cached_tokens=0,
                client_ttft_seconds=0.3,
            ),
            make_request(server, "c", minute + timedelta(seconds=59), prompt_tokens=50, cached_tokens=32),
            # A span's record: its cached tokens are unknown.
            make_request(server, "d", minute + timedelta(seconds=59), prompt_tokens=70),
        ]
    )

    refresh_minute_rollups(since=minute, until=minute + timedelta(minutes=1))
    refresh_minute_rollups(since=minute, until=minute + timedelta(minutes=1))  # converges, no doubling

    by_template = MinuteRollup.objects.get(server=server, template=template, minute=minute)
    assert (by_template.requests, by_template.prompt_tokens, by_template.cached_tokens) == (2, 382, 160)
    assert by_template.client_ttft_count == 2
    assert by_template.client_ttft_sum_seconds == pytest.approx(0.33)
    buckets = dict(zip(TTFT_BUCKETS_SECONDS, by_template.client_ttft_buckets, strict=False))
    assert (buckets[0.02], buckets[0.04], buckets[0.25], buckets[0.5]) == (0, 1, 1, 2)
    assert by_template.client_ttft_buckets[-1] == 2  # the +Inf bucket is the count
    # vLLM's measure has its own histogram: one record carried it.
    assert by_template.server_ttft_count == 1
    assert by_template.server_ttft_sum_seconds == pytest.approx(0.015)
    server_buckets = dict(zip(TTFT_BUCKETS_SECONDS, by_template.server_ttft_buckets, strict=False))
    assert (server_buckets[0.01], server_buckets[0.02]) == (0, 1)
    untemplated = MinuteRollup.objects.get(server=server, template=None, minute=minute)
    assert (untemplated.requests, untemplated.cached_tokens, untemplated.client_ttft_count) == (2, 32, 0)
    assert (untemplated.prompt_tokens, untemplated.cache_known_prompt_tokens) == (120, 50)
    assert by_template.cache_known_prompt_tokens == 382


def test_a_late_record_updates_its_minute_on_the_next_refresh(server: Server) -> None:
    minute = this_minute() - timedelta(minutes=5)
    RequestRecord.objects.create(
        server=server, request_id="a", arrived_at=minute, source="rest", prompt_tokens=10
    )
    refresh_minute_rollups(since=minute, until=minute + timedelta(minutes=1))
    RequestRecord.objects.create(
        server=server, request_id="b", arrived_at=minute, source="rest", prompt_tokens=5
    )
    refresh_minute_rollups(since=minute, until=minute + timedelta(minutes=1))
    rollup = MinuteRollup.objects.get(server=server, minute=minute)
    assert (rollup.requests, rollup.prompt_tokens) == (2, 15)


def test_token_ids_are_forgotten_after_their_retention_and_hashes_kept(server: Server) -> None:
    now = timezone.now()
    old = make_request(server, "old", now - timedelta(days=8), token_ids=[1, 2, 3], block_hashes=[5])
    recent = make_request(server, "recent", now - timedelta(days=1), token_ids=[4, 5, 6], block_hashes=[6])
    with connection.cursor() as cursor:
        old_day = (now - timedelta(days=8)).replace(hour=0, minute=0, second=0, microsecond=0)
        cursor.execute(
            "CREATE TABLE traffic_requestrecord_retention_test PARTITION OF traffic_requestrecord "
            "FOR VALUES FROM (%s) TO (%s)",
            [old_day, old_day + timedelta(days=1)],
        )
    RequestRecord.objects.bulk_create([old, recent])

    with override_settings(PREFIXSCOPE_TOKEN_RETENTION_DAYS=7):
        assert expire_token_ids(now=now) == 1
    kept = dict(RequestRecord.objects.values_list("request_id", "token_ids"))
    assert kept == {"old": None, "recent": [4, 5, 6]}
    assert RequestRecord.objects.get(request_id="old").block_hashes == [5]

    with override_settings(PREFIXSCOPE_HASH_ONLY=True):
        assert expire_token_ids(now=now) == 1
    assert RequestRecord.objects.get(request_id="recent").token_ids is None
