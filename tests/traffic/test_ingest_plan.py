"""The probe for stored records, planned on a day's partition that has no statistics yet.

Every day's request records go to a new partition, which autovacuum analyzes some time after its
first rows. Until then the planner knows nothing of request ids, and the probe each batch runs
(is a record stored near one of these keys?) must still look each id up in the primary key rather
than scan the window testing every row: that plan cost a thousand-record batch 25 ms at 3,000 rows
stored and grew with them.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from app.traffic.services.record_rows import stored_near_probe
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db


def test_the_probe_looks_each_request_id_up_in_the_primary_key_before_any_statistics() -> None:
    server = a_server(name="vllm-0", block_size=32)
    # The day after tomorrow: a partition no other test writes to. Batches of requests that
    # arrived within the same second, as a gateway's are.
    day = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0) + timedelta(days=2)
    stored = [RequestFacts(server="vllm-0", request_id=f"cmpl-{n}", arrived_at=day) for n in range(3000)]
    assert ingest_request_records(stored, source="rest", now=timezone.now()).stored == 3000
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM traffic_requestrecord r JOIN pg_class c ON c.oid = r.tableoid "
            "WHERE r.request_id = 'cmpl-0'"
        )
        (partition,) = cursor.fetchone()
        cursor.execute("SELECT pg_clear_relation_stats('public', %s)", [partition])
        cursor.execute(
            "SELECT pg_clear_attribute_stats('public', %s, attname, false) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            [partition, partition],
        )
        new = [(f"cmpl-new-{n}", day) for n in range(1000)]
        probe, parameters = stored_near_probe({server.pk: new})
        cursor.execute(f"EXPLAIN {probe}", parameters)
        plan = "\n".join(line for (line,) in cursor.fetchall())
        cursor.execute(probe, parameters)
        assert cursor.fetchone() == (False,)
    assert f"{partition}_pkey" in plan, plan
    assert "request_id = k.request_id" in plan.split("Index Cond:")[1], plan
    assert "Filter" not in plan, plan
