"""What each source delivered against what the engine served, per server on /metrics: the records
Prefixscope stored by source, and the requests the engine's own counter finished. An engine that
grows while a source that used to send sends nothing is a collector lost (RequestRecordsStopped)."""

from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db import connection
from prometheus_client.core import CounterMetricFamily, Metric

from app.dashboard.metrics.traffic import start_of_day
from app.fleet.models import Server
from app.traffic.models import RecordsReceived
from collectors.metrics.names import FINISHED_REQUESTS

# A source silent this long is no longer expected of its server (retired on purpose, or moved): its
# series goes, and RequestRecordsStopped with it. Long enough that an outage pages well before.
EXPECTED_FOR = timedelta(days=7)

_ENGINE_SQL = """
SELECT s.name, s.model, coalesce(sum(m.finished_requests), 0) FROM fleet_server s
LEFT JOIN traffic_serverminute m ON m.server_id = s.id AND m.minute >= %(since)s
WHERE s.state <> %(disabled)s GROUP BY s.id, s.name, s.model
"""


def arrival_families(now: datetime) -> Iterator[Metric]:
    """`prefixscope_request_records_received_total{server, source}` (since each pair's first record:
    a pair that never sent, or sent nothing for EXPECTED_FOR, has no series) and
    `prefixscope_server_engine_requests_total{server, model}` (since midnight UTC, from the server
    minutes; every server not disabled, 0 before its first)."""
    received = CounterMetricFamily(
        "prefixscope_request_records_received",
        "Request records stored per server and source (gateway, otlp, rest) since the source's first.",
        labels=["server", "source"],
    )
    expected = RecordsReceived.objects.filter(last_received_at__gte=now - EXPECTED_FOR).exclude(
        server__state=Server.State.DISABLED
    )
    for name, source, count in expected.values_list("server__name", "source", "count"):
        received.add_metric([name, source], float(count))
    engine = CounterMetricFamily(
        "prefixscope_server_engine_requests",
        f"Requests the engine finished by its own counter ({', '.join(FINISHED_REQUESTS)}), whoever sent "
        "them, since midnight UTC (from the server minutes).",
        labels=["server", "model"],
    )
    with connection.cursor() as cursor:
        cursor.execute(_ENGINE_SQL, {"since": start_of_day(now), "disabled": Server.State.DISABLED})
        for name, model, finished in cursor.fetchall():
            engine.add_metric([name, model], float(finished))
    yield from (received, engine)
