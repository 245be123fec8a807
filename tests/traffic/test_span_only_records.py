"""Records only vLLM's spans saw are evidence, not requests: they count in no request total and
not in the tenant audit (vLLM's spans carry no tenant), while a span merged with its gateway
record still counts once."""

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Sum
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.diagnosis.tenants import tenant_audit
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import MinuteRollup, RequestDiagnosis, RequestRecord, ServerRequestMinute
from tests.support.factories import a_server, facts, ingested

pytestmark = pytest.mark.django_db


def test_span_only_records_are_not_requests_in_the_rollups_or_the_tenant_audit() -> None:
    a_server(name="vllm-0")
    now = timezone.now().replace(microsecond=0)
    at = now - timedelta(minutes=3)

    def send(source: str, request_id: str, **fields: Any) -> None:
        ingested(
            facts(request_id=request_id, arrived_at=at, server="vllm-0", prompt_tokens=100, **fields),
            source=source,
            now=now,
        )

    gateway = {"tenant": "acme", "cached_tokens": 32, "client_ttft_seconds": 0.2}
    send("gateway", "req-1", **gateway)
    send("otlp", "req-1", server_ttft_seconds=0.1)  # vLLM's span of a request the gateway saw
    send("otlp", "req-2", server_ttft_seconds=0.1)  # vLLM's span alone
    send("otlp", "req-3", server_ttft_seconds=0.1)  # the span first, then the gateway
    send("gateway", "req-3", **gateway)

    refresh_minute_rollups(since=at, until=now)

    assert dict(RequestRecord.objects.values_list("request_id", "source")) == {
        "req-1": "gateway", "req-2": "otlp", "req-3": "gateway"
    }  # fmt: skip
    totals = MinuteRollup.objects.aggregate(requests=Sum("requests"), prompt=Sum("prompt_tokens"))
    assert totals == {"requests": 2, "prompt": 200}
    assert ServerRequestMinute.objects.aggregate(n=Sum("requests"))["n"] == 2
    assert MinuteRollup.objects.aggregate(n=Sum("server_ttft_count"))["n"] == 3  # vLLM's TTFTs all kept

    diagnose_requests(now=now + timedelta(minutes=5))

    assert RequestDiagnosis.objects.get(request_id="req-2").unknown == "span_only"
    audit = tenant_audit(since=at - timedelta(minutes=1), until=now)
    assert [(row.tenant, row.requests) for row in audit] == [("acme", 2)]
