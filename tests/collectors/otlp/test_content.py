"""A GenAI span's content attributes (OpenTelemetry GenAI conventions, content capture on) read as the
parts of the chat request they describe: the gateway's digests for the same body, the conventions'
examples read, the span's content never kept, and a malformed attribute refused by name."""

import json
from typing import Any

import pytest

from collectors.otlp.content import span_parts
from collectors.otlp.parse import decode_export, span_request
from collectors.parts import PartsError, part_digests
from simulator.spans import genai_content_attributes
from tests.support.captures import VLLM_CPU_FIXTURES

KEY = b"deployment key"
WEATHER = {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
BODY: dict[str, Any] = {
    "model": "tiny",
    "messages": [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                              "function": {"name": "get_weather",
                                                           "arguments": '{"location":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy, 57F"},
        {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "text", "text": "Lyon?"}]},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                                "parameters": WEATHER}}],
}  # fmt: skip


def test_a_span_gives_the_gateways_digests_of_the_body_it_describes() -> None:
    assert span_parts(genai_content_attributes(BODY), key=KEY) == part_digests(BODY, key=KEY)


def test_structured_attributes_read_as_their_json_strings() -> None:
    as_json = genai_content_attributes(BODY)
    structured = {name: json.loads(value) for name, value in as_json.items()}
    assert span_parts(structured, key=KEY) == span_parts(as_json, key=KEY)


def test_the_conventions_example_with_separate_system_instructions() -> None:
    # The shapes of gen-ai-system-instructions.json and gen-ai-input-messages.json: instructions given
    # apart from the history are the system message; a tool call's arguments as an object.
    attributes = {
        "gen_ai.system_instructions": [{"type": "text", "content": "You are a language translator."}],
        "gen_ai.input.messages": [
            {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "get_weather",
                                             "arguments": {"location": "Paris"}}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "rainy"}]},
        ],
    }  # fmt: skip
    found = span_parts(attributes, key=KEY)
    assert found is not None and found.system and len(found.messages) == 3 and found.latest == 1
    chat = {"messages": [
        {"role": "system", "content": "You are a language translator."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                              "function": {"name": "get_weather",
                                                           "arguments": '{"location":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy"},
    ]}  # fmt: skip
    assert found == part_digests(chat, key=KEY)


def test_a_tool_recorded_without_its_description_is_another_tool() -> None:
    # The conventions do not populate a tool's description by default: documented in content.py.
    attributes = genai_content_attributes(BODY)
    (tool,) = json.loads(attributes["gen_ai.tool.definitions"])
    del tool["description"]
    bare = attributes | {"gen_ai.tool.definitions": json.dumps([tool])}
    assert span_parts(bare, key=KEY).tools != part_digests(BODY, key=KEY).tools  # type: ignore[union-attr]


def test_a_span_without_its_input_messages_has_no_parts() -> None:
    assert span_parts({"gen_ai.tool.definitions": "[]"}, key=KEY) is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("gen_ai.input.messages", "{not json"),
        ("gen_ai.input.messages", '{"role": "user"}'),
        ("gen_ai.input.messages", '[{"role": "user", "parts": "Paris"}]'),
        ("gen_ai.input.messages", '[{"parts": []}]'),
        ("gen_ai.tool.definitions", '"get_weather"'),
        ("gen_ai.system_instructions", '[{"type": "text", "content": 7}]'),
    ],
)
def test_a_content_attribute_of_another_shape_is_refused_by_name(name: str, value: str) -> None:
    attributes = {"gen_ai.input.messages": "[]", name: value}
    with pytest.raises(PartsError, match=f"^{name}:") as refused:
        span_parts(attributes, key=KEY)
    assert "Paris" not in str(refused.value)


def test_the_captured_vllm_spans_carry_no_content_and_so_no_parts() -> None:
    capture = (VLLM_CPU_FIXTURES / "otlp" / "traces-01.pb").read_bytes()
    requests = [span_request(s, digest_key=KEY) for s in decode_export(capture, "application/x-protobuf")]
    assert len([r for r in requests if r]) == 18 and all(r.parts is None for r in requests if r)


def test_a_span_keeps_the_digests_and_never_the_text() -> None:
    attributes = [{"key": k, "value": {"stringValue": v}} for k, v in genai_content_attributes(BODY).items()]
    attributes += [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                   {"key": "gen_ai.response.id", "value": {"stringValue": "chatcmpl-9"}}]  # fmt: skip
    span = {"traceId": "5b8aa5a2d2c872e8321cf37308d69df2", "spanId": "051581bf3cb55c13", "name": "chat",
            "startTimeUnixNano": "1795988020288461056", "attributes": attributes}  # fmt: skip
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    (decoded,) = decode_export(body, "application/json")
    request = span_request(decoded, digest_key=KEY)
    assert request is not None and request.parts == part_digests(BODY, key=KEY)
    assert b"Paris" not in repr(request).encode() and span_request(decoded).parts is None  # type: ignore[union-attr]
