"""vLLM's captured OTLP export, in protobuf and in OTLP/JSON, read into request facts."""

import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.otlp.parse import REQUEST_ATTRIBUTES, OTLPDecodeError, decode_export, span_request
from collectors.records import canonical_request_id
from collectors.usage.parse import UsageError
from tests.support.captures import VLLM_CPU_FIXTURES, load_json, otlp_json

CAPTURE = (VLLM_CPU_FIXTURES / "otlp" / "traces-01.pb").read_bytes()
RESPONSES = [
    "completion-shared-prefix-the",
    "completion-salt-a-1",
    "completion-evict-3",
    "completion-report-full",
]


def test_every_captured_llm_request_span_becomes_a_request_with_the_response_id() -> None:
    requests = [r for r in map(span_request, decode_export(CAPTURE, "application/x-protobuf")) if r]
    assert len(requests) == 18
    by_id = {r.request_id: r for r in requests}
    for name in RESPONSES:
        response = load_json(f"{name}.json")["response"]
        found = by_id[canonical_request_id(response["id"])]  # the engine's "-0" suffix is gone
        usage = (found.prompt_tokens, found.cached_tokens, found.completion_tokens)
        assert usage == (response["usage"]["prompt_tokens"], None, response["usage"]["completion_tokens"])
        assert found.server_ttft_seconds and found.queue_seconds is not None and found.prefill_seconds
        assert found.client_ttft_seconds is None  # vLLM's measure is not the client's
        assert found.server == "" and len(found.trace_id) == 32


def attributes_by_opentelemetry_proto(body: bytes) -> list[dict[str, object]]:
    """Each span's attributes over its resource's, read through opentelemetry-proto's own messages."""
    export = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body))
    read = []
    for resource_spans in export["resourceSpans"]:
        resource = resource_spans.get("resource", {}).get("attributes", [])
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                pairs = resource + span.get("attributes", [])
                read.append({pair["key"]: next(iter(pair["value"].values())) for pair in pairs})
    return read


def test_the_reader_sees_the_attributes_opentelemetry_proto_sees() -> None:
    # The reader's map of attributes is the same bytes as OTLP's list of KeyValue (collectors/otlp/reader.py).
    expected = attributes_by_opentelemetry_proto(CAPTURE)
    spans = decode_export(CAPTURE, "application/x-protobuf")
    assert len(spans) == len(expected) == 18
    for span, attributes in zip(spans, expected, strict=True):
        # JSON's mapping writes 64-bit integers as strings: compare as protobuf's JSON would.
        assert {k: str(v) if isinstance(v, int) else v for k, v in span.attributes.items()} == attributes
    wanted = decode_export(CAPTURE, "application/x-protobuf", keys=REQUEST_ATTRIBUTES)
    assert [s.attributes for s in wanted] == [
        {k: v for k, v in s.attributes.items() if k in REQUEST_ATTRIBUTES} for s in spans
    ]


def test_otlp_json_gives_the_same_requests_as_protobuf() -> None:
    from_protobuf = [span_request(s) for s in decode_export(CAPTURE, "application/x-protobuf")]
    from_json = [span_request(s) for s in decode_export(otlp_json(CAPTURE), "application/json")]
    assert from_json == from_protobuf


def test_a_genai_application_span_carries_cached_tokens_and_prefixscope_attributes() -> None:
    attributes = [
        ("gen_ai.operation.name", {"stringValue": "chat"}),
        ("gen_ai.response.id", {"stringValue": "chatcmpl-42"}),
        ("gen_ai.usage.input_tokens", {"intValue": "1941"}),
        ("gen_ai.usage.cache_read.input_tokens", {"intValue": "1800"}),
        ("prefixscope.template", {"stringValue": "support"}),
        ("prefixscope.tenant", {"stringValue": "acme"}),
    ]
    span = {
        "traceId": "5b8aa5a2d2c872e8321cf37308d69df2",
        "spanId": "051581bf3cb55c13",
        "name": "chat tiny",
        "startTimeUnixNano": "1795988020288461056",
        "attributes": [{"key": key, "value": value} for key, value in attributes],
    }
    resource = {"attributes": [{"key": "prefixscope.server", "value": {"stringValue": "vllm-0"}}]}
    export = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}
    (decoded,) = decode_export(json.dumps(export).encode(), "application/json")
    request = span_request(decoded)
    assert request is not None
    assert (request.request_id, request.server, request.template, request.tenant) == (
        "42",  # the answer id chatcmpl-42, canonical
        "vllm-0",
        "support",
        "acme",
    )
    assert (request.prompt_tokens, request.cached_tokens, request.completion_tokens) == (1941, 1800, None)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b"\x0a\xff\xff", "application/x-protobuf"), (b"{not json", "application/json")],
)
def test_a_body_that_is_not_an_export_is_refused(body: bytes, content_type: str) -> None:
    with pytest.raises(OTLPDecodeError):
        decode_export(body, content_type)


def test_a_duration_that_is_not_a_number_names_the_attribute() -> None:
    (span, *_) = [s for s in decode_export(CAPTURE, "application/x-protobuf") if s.name == "llm_request"]
    broken = type(span)(
        span.trace_id,
        span.name,
        span.start,
        {**span.attributes, "gen_ai.latency.time_to_first_token": "fast"},
    )
    with pytest.raises(UsageError, match=r"gen_ai\.latency\.time_to_first_token"):
        span_request(broken)


def _anthropic_span(*extra: tuple[str, object]) -> bytes:
    # An instrumented Anthropic client's GenAI span (gen_ai.provider.name "anthropic"); the TTL of its
    # cache write in Prefixscope's own attribute: the GenAI conventions name none.
    attributes = [
        ("gen_ai.operation.name", {"stringValue": "chat"}), ("gen_ai.response.id", {"stringValue": "msg_7"}),
        ("gen_ai.provider.name", {"stringValue": "anthropic"}),
        ("gen_ai.usage.input_tokens", {"intValue": "4100"}),
        ("gen_ai.usage.cache_creation.input_tokens", {"intValue": "4000"}), *extra,
    ]  # fmt: skip
    span = {"traceId": "5b8aa5a2d2c872e8321cf37308d69df2", "spanId": "051581bf3cb55c13", "name": "chat",
            "startTimeUnixNano": "1795988020288461056",
            "attributes": [{"key": key, "value": value} for key, value in attributes]}  # fmt: skip
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


def test_a_hosted_span_says_the_ttl_of_its_cache_write() -> None:
    ttl = ("prefixscope.cache_ttl", {"stringValue": "1h"})
    (span,) = decode_export(_anthropic_span(ttl), "application/json")
    request = span_request(span)
    assert request is not None
    found = (request.provider, request.cache_write_tokens, request.cache_ttl_seconds)
    assert found == ("anthropic", 4000, 3600)
    (unsaid,) = decode_export(_anthropic_span(), "application/json")
    assert span_request(unsaid).cache_ttl_seconds is None  # type: ignore[union-attr]


def test_a_ttl_that_is_not_one_names_the_attribute() -> None:
    ttl = ("prefixscope.cache_ttl", {"stringValue": "soon"})
    (span,) = decode_export(_anthropic_span(ttl), "application/json")
    with pytest.raises(UsageError, match=r"prefixscope\.cache_ttl"):
        span_request(span)
