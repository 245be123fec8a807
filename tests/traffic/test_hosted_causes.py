"""Hosted-API causes against what the simulator injected (simulator/hosted.py): its records sent
through the real REST ingest (Anthropic and Bedrock shapes) and OTLP GenAI spans (OpenAI), then
diagnosed; the confusion table (requests by injected and found cause) is printed, and must be
diagonal: each injected request is found with its cause, and no other cause is found."""

import json
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client, override_settings
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client.parser import text_string_to_metric_families

from app.api.services import create_ingest_token
from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.traffic.models import LossMinute, RequestDiagnosis, RequestRecord
from simulator.hosted import HIT, HostedRequest, hosted_traffic

pytestmark = pytest.mark.django_db


def _value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[_value(item) for item in value]))
    return AnyValue(string_value=str(value))


def genai_span(request: HostedRequest) -> Span:
    """The OpenTelemetry GenAI span an instrumented OpenAI client sends for the record."""
    record, usage = request.record, request.record["usage"]
    attributes = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "server.address": "api.openai.com",
        "gen_ai.response.id": f"chatcmpl-{record['request_id']}", "gen_ai.request.model": record["model"],
        "gen_ai.usage.input_tokens": usage["prompt_tokens"], "gen_ai.usage.output_tokens": 40,
        "gen_ai.usage.cache_read.input_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        "prefixscope.server": record["server"], "prefixscope.tenant": record["tenant"],
        "prefixscope.prompt_blocks": record["prompt_blocks"],
    }  # fmt: skip
    if "prompt_cache_key" in record:
        attributes["prefixscope.prompt_cache_key"] = record["prompt_cache_key"]
    if "response_headers" in record:
        attributes["prefixscope.semantic_cache_hit"] = True
    start = int(datetime.fromisoformat(record["arrived_at"]).timestamp() * 1e9)
    return Span(
        trace_id=bytes(16), span_id=bytes(8), name="chat", start_time_unix_nano=start,
        end_time_unix_nano=start + 10**9,
        attributes=[KeyValue(key=key, value=_value(value)) for key, value in attributes.items()],
    )  # fmt: skip


def send(client: Client, token: str, requests: list[HostedRequest]) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    rest = [request.record for request in requests if not request.over_otlp]
    answer = client.post("/api/v1/requests", json.dumps(rest), content_type="application/json", headers=auth)
    assert answer.status_code == 200, answer.content
    spans = [genai_span(request) for request in requests if request.over_otlp]
    export = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
    answer = client.post(
        "/v1/traces", export.SerializeToString(), content_type="application/x-protobuf", headers=auth
    )
    assert answer.status_code == 200, answer.content


def found_cause(diagnosis: RequestDiagnosis) -> str:
    if diagnosis.unknown:
        return diagnosis.unknown
    return HIT if diagnosis.cause in ("", "new_content") else diagnosis.cause


def confusion(rows: Counter[tuple[str, str]]) -> str:
    found = sorted({f for _, f in rows})
    lines = ["injected \\ found".ljust(20) + "".join(name[:16].rjust(17) for name in found)]
    for injected in sorted({i for i, _ in rows}):
        lines.append(injected.ljust(20) + "".join(str(rows[injected, f]).rjust(17) for f in found))
    return "\n".join(lines)


def test_each_injected_hosted_cause_is_found(client: Client) -> None:
    now = timezone.now()
    requests = hosted_traffic(start=now - timedelta(hours=1), sessions=4)
    send(client, create_ingest_token(name="hosted-apps"), requests)
    assert RequestRecord.objects.count() == len(requests)
    forget_kept_replay()
    with override_settings(PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS=0, PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES=180):
        diagnose_requests(now=now)
    injected = {request.record["request_id"]: request.injected for request in requests}
    rows = Counter(
        (injected[d.request_id.removeprefix("chatcmpl-")], found_cause(d))
        for d in RequestDiagnosis.objects.all()
    )
    print("\n" + confusion(rows))  # noqa: T201
    assert sum(rows.values()) == len(requests)
    assert {pair: n for pair, n in rows.items() if pair[0] != pair[1]} == {}


def test_semantic_cache_answers_are_counted_apart_never_as_reuse(client: Client) -> None:
    now = timezone.now()
    requests = hosted_traffic(start=now - timedelta(hours=1), sessions=1)
    send(client, create_ingest_token(name="hosted-apps"), requests)
    forget_kept_replay()
    with override_settings(PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS=0, PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES=180):
        diagnose_requests(now=now)
    answered = sum(request.injected == "gateway_cache" for request in requests)
    assert LossMinute.objects.aggregate(n=Sum("gateway_cache_hits"))["n"] == answered
    gateway = RequestDiagnosis.objects.filter(unknown="gateway_cache")
    assert gateway.count() == answered and not gateway.filter(reused_tokens__gt=0).exists()
    families = text_string_to_metric_families(client.get("/metrics").content.decode())
    served = {s.labels["server"]: s.value for f in families for s in f.samples
              if s.name == "prefixscope_server_gateway_cache_answers_total"}  # fmt: skip
    assert served.get("openai-api") == answered
