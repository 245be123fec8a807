"""KV events past their retention go a day at a time, as a partition dropped: the cost of a catalogue
change whatever the day holds (a fleet's day is some 100 million rows), never a DELETE that scans
and deletes row by row, then leaves the table to vacuum."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from app.fleet.models import Server
from app.traffic.models import KVEvent
from app.traffic.services.kv_events import KVEventRow, StreamPosition, store_kv_events
from app.traffic.services.partitions import maintain_partitions, partition_ranges

pytestmark = pytest.mark.django_db


def stored_block(server: Server, seq: int, at: datetime) -> KVEventRow:
    return KVEventRow(server.pk, 0, 0, seq, 0, 0, at, at, KVEvent.Kind.STORED, seq, None, 16, "", "", None)


def test_a_day_of_kv_events_past_retention_is_a_partition_dropped_not_rows_deleted() -> None:
    server = Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000")
    old_day = datetime.combine(timezone.now().date() - timedelta(days=5), datetime.min.time(), tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE traffic_kvevent_retention_test PARTITION OF traffic_kvevent "
            "FOR VALUES FROM (%s) TO (%s)",
            [old_day, old_day + timedelta(days=1)],
        )
    now = timezone.now()
    rows = [stored_block(server, seq, old_day + timedelta(minutes=seq)) for seq in range(100)]
    rows.append(stored_block(server, 100, now))
    store_kv_events(rows=rows, positions=[StreamPosition(server.pk, 0, 0, 100, now)])
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # as production's own transaction would have
    before = set(partition_ranges("traffic_kvevent"))

    with (
        override_settings(PREFIXSCOPE_KV_EVENT_RETENTION_DAYS=2),
        CaptureQueriesContext(connection) as queries,
    ):
        changes = maintain_partitions(now=now)

    assert set(partition_ranges("traffic_kvevent")) == before - {"traffic_kvevent_retention_test"}
    assert "traffic_kvevent_retention_test" in changes.dropped
    statements = [query["sql"].upper() for query in queries.captured_queries]
    assert any(s.startswith('DROP TABLE "TRAFFIC_KVEVENT_RETENTION_TEST"') for s in statements), statements
    assert not [s for s in statements if s.lstrip().startswith(("DELETE", "TRUNCATE"))]
    assert list(KVEvent.objects.values_list("seq", flat=True)) == [100]  # today's row untouched
