"""vLLM's captured OTLP export, in protobuf and in OTLP/JSON, read into request facts."""

import json

import pytest

from collectors.otlp.parse import OTLPDecodeError, decode_export, span_request
from collectors.usage.parse import Usage, UsageError
from tests.fixtures import VLLM_CPU_FIXTURES, load_json, otlp_json

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
        found = by_id[response["id"]]  # the engine's "-0" suffix is gone
        assert found.usage == Usage(
            response["usage"]["prompt_tokens"], None, response["usage"]["completion_tokens"]
        )
        assert found.ttft_seconds and found.queue_seconds is not None and found.prefill_seconds
        assert found.server is None and len(found.trace_id) == 32


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
        "chatcmpl-42",
        "vllm-0",
        "support",
        "acme",
    )
    assert request.usage == Usage(1941, 1800, None)


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
