"""The OTLP/HTTP receiver with vLLM's captured export (its times moved to now, where partitions exist)."""

import gzip
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from app.api.ingest import admission
from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.traffic.models import RejectedInput, RequestRecord
from collectors.records import canonical_request_id
from tests.support.captures import VLLM_CPU_FIXTURES, load_json, otlp_json

pytestmark = pytest.mark.django_db
PROTOBUF = "application/x-protobuf"


def captured_export(*, shift_to: float | None = None) -> ExportTraceServiceRequest:
    export: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(
        (VLLM_CPU_FIXTURES / "otlp" / "traces-01.pb").read_bytes()
    )
    spans = [s for rs in export.resource_spans for ss in rs.scope_spans for s in ss.spans]
    delta = int(((shift_to or time.time()) * 1e9) - min(s.start_time_unix_nano for s in spans))
    for span in spans:
        span.start_time_unix_nano += delta
        span.end_time_unix_nano += delta
    return export


@pytest.fixture
def token() -> str:
    Server.objects.create(name="vllm-cpu", base_url="http://127.0.0.1:18000", block_size=32)
    return create_ingest_token(name="vllm-cpu")  # spans without prefixscope.server belong to it


def post(
    client: Client, token: str, body: bytes, content_type: str = PROTOBUF, **headers: str
) -> Any:  # the test client's response
    return client.post(
        "/v1/traces", body, content_type=content_type, headers={"Authorization": f"Bearer {token}", **headers}
    )


def test_vllm_spans_become_request_records_of_the_tokens_server(client: Client, token: str) -> None:
    response = post(client, token, captured_export().SerializeToString())

    assert response.status_code == 200
    assert not ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")
    assert RequestRecord.objects.filter(server__name="vllm-cpu", source="otlp").count() == 18
    evict = load_json("completion-evict-2.json")["response"]
    stored = RequestRecord.objects.get(request_id=canonical_request_id(evict["id"]))
    assert (stored.prompt_tokens, stored.completion_tokens) == (283, evict["usage"]["completion_tokens"])
    assert stored.server_ttft_seconds and stored.server_ttft_seconds < 1 and stored.cached_tokens is None
    assert stored.client_ttft_seconds is None


def test_gzip_json_exports_are_read_too(client: Client, token: str) -> None:
    body = gzip.compress(otlp_json(captured_export().SerializeToString()))
    response = post(client, token, body, "application/json", **{"Content-Encoding": "gzip"})
    assert response.status_code == 200 and json.loads(response.content) == {}
    assert RequestRecord.objects.count() == 18


def test_a_span_joins_the_record_the_gateway_stored_moments_earlier(client: Client, token: str) -> None:
    export = captured_export()
    capture = load_json("completion-salt-a-2.json")["response"]
    span = next(
        s
        for rs in export.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        if any(a.value.string_value == capture["id"] + "-0" for a in s.attributes)
    )
    seen_by_gateway = datetime.fromtimestamp(span.start_time_unix_nano / 1e9, tz=UTC)
    seen_by_gateway -= timedelta(milliseconds=3)
    request_id = canonical_request_id(capture["id"])
    RequestRecord.objects.create(
        server=Server.objects.get(),
        request_id=request_id,
        arrived_at=seen_by_gateway,
        source="gateway",
        cached_tokens=capture["usage"]["prompt_tokens_details"]["cached_tokens"],
        client_ttft_seconds=0.0187,
    )

    post(client, token, export.SerializeToString())

    joined = RequestRecord.objects.get(request_id=request_id)
    assert (joined.arrived_at, joined.source, joined.cached_tokens) == (seen_by_gateway, "gateway", 160)
    assert joined.prompt_tokens == capture["usage"]["prompt_tokens"]
    # Both TTFTs kept: the span's (vLLM's measure) no longer overwrites the client's.
    assert joined.client_ttft_seconds == 0.0187
    assert joined.server_ttft_seconds is not None and joined.server_ttft_seconds != 0.0187


def test_a_malformed_span_is_counted_and_the_others_kept(client: Client, token: str) -> None:
    export = captured_export()
    span = export.resource_spans[0].scope_spans[0].spans[0]
    attribute = next(a for a in span.attributes if a.key == "gen_ai.latency.time_to_first_token")
    attribute.value.string_value = "fast"

    answer = ExportTraceServiceResponse.FromString(post(client, token, export.SerializeToString()).content)

    assert answer.partial_success.rejected_spans == 1
    assert "gen_ai.latency.time_to_first_token" in answer.partial_success.error_message
    assert RequestRecord.objects.count() == 17


def test_span_content_is_kept_as_its_digests_and_content_of_another_shape_rejected_alone(
    client: Client, token: str
) -> None:
    export = captured_export()
    good, bad = export.resource_spans[0].scope_spans[0].spans[:2]
    messages = [{"role": "user", "parts": [{"type": "text", "content": "Where is my parcel?"}]}]
    good.attributes.add(key="gen_ai.input.messages").value.string_value = json.dumps(messages)
    bad.attributes.add(key="gen_ai.input.messages").value.string_value = "Where is my parcel?"

    answer = ExportTraceServiceResponse.FromString(post(client, token, export.SerializeToString()).content)

    reason = "span llm_request: gen_ai.input.messages: not JSON"
    assert (answer.partial_success.rejected_spans, answer.partial_success.error_message) == (1, reason)
    assert RejectedInput.objects.get(source="otlp").reason == "parts_invalid"
    stored = RequestRecord.objects.exclude(part_digests=None).values_list("part_digests", flat=True)
    assert len(stored) == 1 and stored[0]["latest"] == 1 and "parcel" not in json.dumps(stored[0])
    assert RequestRecord.objects.count() == 17


def test_no_token_no_data_and_a_bad_body_is_a_400(client: Client, token: str) -> None:
    body = captured_export().SerializeToString()
    assert client.post("/v1/traces", body, content_type=PROTOBUF).status_code == 401
    assert post(client, "psi_unknown", body).status_code == 401
    assert post(client, token, b"\x0a\xff\xff").status_code == 400
    assert not RequestRecord.objects.exists()


def test_an_export_over_the_limit_once_decompressed_is_a_413(
    client: Client, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = captured_export().SerializeToString()
    monkeypatch.setattr(admission, "MAX_BODY_BYTES", len(body) - 1)  # the gzip body itself is smaller
    response = post(client, token, gzip.compress(body), PROTOBUF, **{"Content-Encoding": "gzip"})
    assert response.status_code == 413
    assert not RequestRecord.objects.exists()


def test_malformed_spans_are_counted_per_server_and_reason(client: Client, token: str) -> None:
    export = captured_export()
    spans = export.resource_spans[0].scope_spans[0].spans
    for span in spans[:3]:
        ttft = next(a for a in span.attributes if a.key == "gen_ai.latency.time_to_first_token")
        ttft.value.string_value = "fast"
    named = spans[2].attributes.add(key="prefixscope.server")
    named.value.string_value = "vllm-nobody-registered"

    answer = ExportTraceServiceResponse.FromString(post(client, token, export.SerializeToString()).content)

    assert answer.partial_success.rejected_spans == 3
    counted = RejectedInput.objects.filter(source="otlp").values_list("server__name", "detail", "count")
    reason = "gen_ai.latency.time_to_first_token: expected a duration in seconds"
    assert set(counted) == {("vllm-cpu", reason, 2), (None, reason, 1)}
    assert RequestRecord.objects.count() == 15


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("gen_ai.request.id", "cmpl-" + "r" * 300 + "-0", "request_id: longer than 255 characters"),
        ("gen_ai.response.model", "m" * 300, "model: longer than 255 characters"),
        ("prefixscope.tenant", "t" * 101, "tenant: longer than 100 characters"),
        ("prefixscope.tenant", "acme\x00", "tenant: contains a NUL character"),
        ("gen_ai.usage.cache_read.input_tokens", 10_000, "cached_tokens: more than prompt_tokens"),
    ],
)
def test_a_span_the_database_cannot_take_is_rejected_alone_and_counted(
    client: Client, token: str, key: str, value: object, reason: str
) -> None:
    export = captured_export()
    attribute = export.resource_spans[0].scope_spans[0].spans[0].attributes.add(key=key)
    if isinstance(value, int):
        attribute.value.int_value = value
    else:
        attribute.value.string_value = str(value)

    response = post(client, token, export.SerializeToString())

    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert (answer.partial_success.rejected_spans, answer.partial_success.error_message) == (1, reason)
    assert RejectedInput.objects.get(source="otlp").detail == reason
    assert RequestRecord.objects.count() == 17
