"""OTLP/HTTP trace exports decoded into plain spans, and the spans that describe an inference request.

Two kinds of span carry request facts:
- vLLM's `llm_request` span: TTFT as vLLM measured it, queue and prefill time, token counts and
  `gen_ai.request.id`, the engine request's id (`cmpl-<id>-<prompt index>`, `chatcmpl-<id>`;
  collectors/records.py maps it to the canonical request id); no cached tokens.
- An application's OpenTelemetry GenAI span (`gen_ai.operation.name` chat/text_completion):
  `gen_ai.response.id` (the answer's id, `chatcmpl-<id>`), `gen_ai.usage.*` including
  `gen_ai.usage.cache_read.input_tokens`; a TTFT it carries is the client's.
Either may name Prefixscope's own attributes: `prefixscope.server` (also as a resource attribute,
e.g. OTEL_RESOURCE_ATTRIBUTES on the vLLM server), `prefixscope.template`,
`prefixscope.template_version`, `prefixscope.tenant`.
An application's span that records the request's content (GenAI content capture) gives its parts'
digests (collectors/otlp/content.py); the content itself is dropped once digested.
"""

import base64
import json
import math
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from collectors.otlp.content import CONTENT_ATTRIBUTES, span_body
from collectors.otlp.reader import Export
from collectors.parts import content_blocks, part_digests
from collectors.records import (
    PROMPT_BLOCKS_MAX,
    RequestFacts,
    canonical_engine_request_id,
    canonical_request_id,
)
from collectors.usage.parse import UsageError, ttl_seconds, usage_from_span

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
# What span_request reads. A receiver passes these to decode_export, which then looks up only these
# keys: a span carries a dozen more attributes (and its resource as many), and converting them all
# is work thrown away on every span.
REQUEST_ATTRIBUTES = (
    "gen_ai.request.id", "gen_ai.response.id", "gen_ai.operation.name", "gen_ai.response.model",
    "gen_ai.request.model", "gen_ai.latency.time_to_first_token", "gen_ai.latency.time_in_queue",
    "gen_ai.latency.time_in_model_prefill", "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
    "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.provider.name", "gen_ai.system", "server.address",
    "prefixscope.server", "prefixscope.tenant", "prefixscope.template", "prefixscope.template_version",
    "prefixscope.prompt_cache_key", "prefixscope.prompt_blocks", "prefixscope.cache_breakpoints",
    "prefixscope.semantic_cache_hit", "prefixscope.cache_ttl", *CONTENT_ATTRIBUTES,
)  # fmt: skip
# GenAI `gen_ai.provider.name` (formerly `gen_ai.system`) values of hosted APIs. "openai" is also
# what OpenAI's client instrumentation says of any server it calls (vLLM included): it is hosted only
# when the span's `server.address` is OpenAI's own (or Azure's).
_HOSTED_NAMES = {
    "anthropic": "anthropic", "aws.bedrock": "bedrock", "gcp.gemini": "gemini",
    "gcp.vertex_ai": "gemini", "gcp.gen_ai": "gemini", "azure.ai.openai": "openai",
}  # fmt: skip
_OPENAI_HOSTS = ("api.openai.com",)
_AZURE_OPENAI_SUFFIX = ".openai.azure.com"


class OTLPDecodeError(ValueError):
    """The body is not an OTLP trace export in the declared encoding."""


# Structs, not dataclasses: an export has hundreds of spans and a frozen Struct is built several
# times faster than a frozen dataclass.
class Span(msgspec.Struct, frozen=True):
    trace_id: str  # hex
    name: str
    start: datetime
    attributes: Mapping[str, Any]  # the span's, over its resource's


def decode_export(body: bytes, content_type: str, *, keys: Collection[str] | None = None) -> list[Span]:
    """Every span of an export, protobuf (`application/x-protobuf`) or JSON (`application/json`).

    With `keys`, a span's attributes (its own over its resource's) are only those named there.
    """
    try:
        if content_type.startswith("application/json"):
            # OTLP/JSON writes attributes as a list of {key, value}: read by OTLP's own message first.
            document = json.loads(body)
            if not isinstance(document, dict):
                raise ValueError("expected a JSON object")
            full = json_format.ParseDict(_ids_to_base64(document), ExportTraceServiceRequest())
            body = full.SerializeToString()
        export = Export.FromString(body)
    except (DecodeError, json_format.ParseError, ValueError, TypeError, AttributeError) as exc:
        # TypeError, AttributeError: an object whose fields have other shapes than the export's
        raise OTLPDecodeError(f"not an OTLP trace export: {exc}") from None
    spans = []
    for resource_spans in export.resource_spans:
        resource = _attributes(resource_spans.resource.attributes, keys)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                start = datetime.fromtimestamp(span.start_time_unix_nano / 1e9, tz=UTC)
                attributes = _attributes(span.attributes, keys)
                if resource:
                    attributes = {**resource, **attributes}
                spans.append(Span(span.trace_id.hex(), span.name, start, attributes))
    return spans


def span_request(span: Span, *, digest_key: bytes | None = None) -> RequestFacts | None:
    """The request a span describes, or None for spans that describe none (start-up, HTTP, ...).
    With `digest_key`, its content attributes' parts digested with it (none without), and a hosted
    API's span that has no `prefixscope.prompt_blocks` gets them from its content.

    Raises UsageError when a token count or duration attribute is not one, PartsError when a
    content attribute is not of the GenAI conventions' shape.
    """
    a = span.attributes
    vllm = span.name == "llm_request" and "gen_ai.request.id" in a
    if vllm:
        request_id = canonical_engine_request_id(str(a["gen_ai.request.id"]))
    elif "gen_ai.response.id" in a and "gen_ai.operation.name" in a:
        request_id = canonical_request_id(str(a["gen_ai.response.id"]))
    else:
        return None
    ttft = _seconds(a, "gen_ai.latency.time_to_first_token")
    usage = usage_from_span(a)
    provider = span_provider(a)
    body = span_body(a) if digest_key is not None else None
    blocks = _strings(a, "prefixscope.prompt_blocks")
    if provider and not blocks and body is not None:  # a hosted prompt's blocks, from its content
        assert digest_key is not None
        blocks = content_blocks(body, key=digest_key, limit=PROMPT_BLOCKS_MAX).digests
    return RequestFacts(
        request_id=request_id, arrived_at=span.start, trace_id=span.trace_id,
        server=_text(a, "prefixscope.server"),
        model=_text(a, "gen_ai.response.model") or _text(a, "gen_ai.request.model"),
        tenant=_text(a, "prefixscope.tenant"), template=_text(a, "prefixscope.template"),
        template_version=_text(a, "prefixscope.template_version"),
        server_ttft_seconds=ttft if vllm else None, client_ttft_seconds=None if vllm else ttft,
        queue_seconds=_seconds(a, "gen_ai.latency.time_in_queue"),
        prefill_seconds=_seconds(a, "gen_ai.latency.time_in_model_prefill"),
        prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens, cache_write_tokens=usage.cache_write_tokens,
        cache_ttl_seconds=_ttl(a),
        provider=provider, prompt_cache_key=_text(a, "prefixscope.prompt_cache_key") or None,
        prompt_blocks=blocks,
        cache_breakpoints=_integers(a, "prefixscope.cache_breakpoints"),
        gateway_cache_hit=_flag(a, "prefixscope.semantic_cache_hit"),
        parts=part_digests(body, key=digest_key) if body is not None and digest_key is not None else None,
    )  # fmt: skip


def _ttl(attributes: Mapping[str, Any]) -> int | None:
    """`prefixscope.cache_ttl` ("5m", "1h"): the GenAI conventions name no attribute for the TTL a
    cache write used."""
    value = attributes.get("prefixscope.cache_ttl")
    return None if value is None else ttl_seconds(value, "prefixscope.cache_ttl")


def span_provider(attributes: Mapping[str, Any]) -> str:
    """The hosted API a GenAI span called (collectors.records.HOSTED_PROVIDERS), "" for none or a
    self-hosted server."""
    name = _text(attributes, "gen_ai.provider.name") or _text(attributes, "gen_ai.system")
    if name in _HOSTED_NAMES:
        return _HOSTED_NAMES[name]
    host = _text(attributes, "server.address").lower()
    if name == "openai" and (host in _OPENAI_HOSTS or host.endswith(_AZURE_OPENAI_SUFFIX)):
        return "openai"
    return ""


def _strings(attributes: Mapping[str, Any], key: str) -> list[str] | None:
    value = attributes.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UsageError(f"{key}: expected an array of strings")
    return value


def _integers(attributes: Mapping[str, Any], key: str) -> list[int] | None:
    value = attributes.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(item) is int for item in value):
        raise UsageError(f"{key}: expected an array of integers")
    return value


def _flag(attributes: Mapping[str, Any], key: str) -> bool | None:
    value = attributes.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise UsageError(f"{key}: expected a boolean")
    return value


def _attributes(attributes: Mapping[str, AnyValue], keys: Collection[str] | None) -> dict[str, Any]:
    if keys is None:
        return {key: _value(value) for key, value in attributes.items()}
    return {key: _value(attributes[key]) for key in keys if key in attributes}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {pair.key: _value(pair.value) for pair in value.kvlist_value.values}
    return None if kind is None else getattr(value, kind)


def _text(attributes: Mapping[str, Any], key: str) -> str:
    value = attributes.get(key)
    return value if isinstance(value, str) else ""


def _seconds(attributes: Mapping[str, Any], key: str) -> float | None:
    value = attributes.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise UsageError(f"{key}: expected a duration in seconds")
    return float(value)


def _ids_to_base64(node: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping wants base64."""
    if isinstance(node, list):
        return [_ids_to_base64(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _ids_to_base64(value) for key, value in node.items()}
    for key in _ID_FIELDS:
        if isinstance(converted.get(key), str) and converted[key]:
            converted[key] = base64.b64encode(bytes.fromhex(converted[key])).decode()
    return converted
