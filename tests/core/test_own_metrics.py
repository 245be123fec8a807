"""Prefixscope's own /metrics reports servers, rejected input and lost KV batches from the database."""

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from app.fleet.models import Server
from app.traffic.models import KVGap, RejectedInput

pytestmark = pytest.mark.django_db


def samples(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics").content.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_own_metrics_count_what_was_collected_and_what_was_not(client: Client) -> None:
    now = timezone.now()
    up = Server.objects.create(name="vllm-up", base_url="http://a:8000", model="tiny")
    down = Server.objects.create(
        name="vllm-down", base_url="http://b:8000", model="tiny", state=Server.State.DOWN
    )
    RejectedInput.objects.create(
        server=up, source="kv_events", reason="not msgpack", count=3, first_seen_at=now, last_seen_at=now
    )
    KVGap.objects.create(server=down, epoch=0, first_seq=5, last_seq=9, recovered=3, lost=2, detected_at=now)
    KVGap.objects.create(
        server=down, epoch=0, first_seq=20, last_seq=20, recovered=0, lost=1, detected_at=now
    )

    values = samples(client)

    assert values[("prefixscope_server_up", (("model", "tiny"), ("server", "vllm-up")))] == 1.0
    assert values[("prefixscope_server_up", (("model", "tiny"), ("server", "vllm-down")))] == 0.0
    reason = (("reason", "not msgpack"), ("server", "vllm-up"), ("source", "kv_events"))
    assert values[("prefixscope_rejected_inputs_total", reason)] == 3.0
    assert values[("prefixscope_kv_event_batches_lost_total", (("server", "vllm-down"),))] == 3.0
