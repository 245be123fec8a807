"""Records are counted by the source that sent them, per server, each batch: a request two sources
both sent counts for each (its row keeps only the first), and /metrics exports the tally beside the
engine's own request counter, so that a source that stopped while the engine served shows."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from app.dashboard.metrics.arrivals import EXPECTED_FOR
from app.fleet.models import Server
from app.traffic.models import RecordsReceived, RequestRecord, ServerMinute
from app.traffic.services.arrivals import count_received_records
from tests.core.test_own_metrics import samples
from tests.support.factories import a_server, facts, ingested

pytestmark = pytest.mark.django_db

RECEIVED = "prefixscope_request_records_received_total"


def test_each_source_counts_the_records_it_sent_even_when_merged_into_one_row(client: Client) -> None:
    now = timezone.now()
    a_server(name="vllm-0")
    a_server(name="vllm-1")
    both = [facts(request_id=f"r{i}", arrived_at=now, server="vllm-0") for i in range(3)]
    ingested(*both, source="gateway", now=now)
    ingested(*both, facts(request_id="s", arrived_at=now, server="vllm-1"), source="otlp", now=now)

    assert set(RequestRecord.objects.values_list("source", flat=True)) == {"gateway", "otlp"}
    tally = {(r.server.name, r.source): r.count for r in RecordsReceived.objects.select_related("server")}
    assert tally == {("vllm-0", "gateway"): 3, ("vllm-0", "otlp"): 3, ("vllm-1", "otlp"): 1}
    values = samples(client)
    assert values[(RECEIVED, (("server", "vllm-0"), ("source", "otlp")))] == 3.0
    assert (RECEIVED, (("server", "vllm-1"), ("source", "gateway"))) not in values  # never sent


def test_a_batch_adds_to_the_tally_of_its_source(client: Client) -> None:
    now = timezone.now()
    server = a_server(name="vllm-0")
    count_received_records(server_ids=[server.pk, server.pk], source="rest", now=now)
    count_received_records(server_ids=[server.pk], source="rest", now=now + timedelta(seconds=5))
    row = RecordsReceived.objects.get(server=server, source="rest")
    assert (row.count, row.first_received_at, row.last_received_at) == (3, now, now + timedelta(seconds=5))


def test_the_engine_counter_sums_todays_finished_requests_of_every_server(client: Client) -> None:
    now = timezone.now()
    busy = a_server(name="vllm-0")
    a_server(name="vllm-idle")
    Server.objects.create(name="off", base_url="http://off:8000", model="tiny", state=Server.State.DISABLED)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    for minute, finished in ((midnight, 4.0), (max(midnight, now - timedelta(minutes=1)), 6.0),
                             (midnight - timedelta(minutes=1), 100.0)):  # fmt: skip
        ServerMinute.objects.update_or_create(
            server=busy, minute=minute, defaults={"finished_requests": finished}
        )
    values = samples(client)
    engine = "prefixscope_server_engine_requests_total"
    today = sum(m.finished_requests for m in ServerMinute.objects.filter(minute__gte=midnight))
    assert values[(engine, (("model", busy.model), ("server", "vllm-0")))] == today >= 6.0
    assert values[(engine, (("model", busy.model), ("server", "vllm-idle")))] == 0.0
    assert not any(name == engine and dict(labels)["server"] == "off" for name, labels in values)


def test_a_source_silent_for_a_week_is_no_longer_expected_of_its_server(client: Client) -> None:
    now = timezone.now()
    server = a_server(name="vllm-0")
    count_received_records(server_ids=[server.pk], source="otlp", now=now - EXPECTED_FOR - timedelta(hours=1))
    count_received_records(server_ids=[server.pk], source="gateway", now=now - timedelta(days=6))
    sources = {dict(labels)["source"] for name, labels in samples(client) if name == RECEIVED}
    assert sources == {"gateway"}
