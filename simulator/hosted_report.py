"""An application reporting its hosted-API usage to Prefixscope: simulator/hosted.py's records sent at
their time, Anthropic and Bedrock usage to the REST ingest (``POST /api/v1/requests``), OpenAI's as
OpenTelemetry GenAI spans (``POST /v1/traces``), each with the application's ingest token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import aiohttp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from simulator.hosted import HostedRequest
from simulator.spans import genai_content_attributes

logger = logging.getLogger(__name__)


def _value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[_value(item) for item in value]))
    return AnyValue(string_value=str(value))


def genai_span(request: HostedRequest) -> Span:
    """The OpenTelemetry GenAI span an instrumented OpenAI client sends for the record (with its
    content, when the record has the request body it sent)."""
    record, usage = request.record, request.record["usage"]
    attributes = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "server.address": "api.openai.com",
        "gen_ai.response.id": f"chatcmpl-{record['request_id']}", "gen_ai.request.model": record["model"],
        "gen_ai.usage.input_tokens": usage["prompt_tokens"], "gen_ai.usage.output_tokens": 40,
        "gen_ai.usage.cache_read.input_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        "prefixscope.server": record["server"], "prefixscope.tenant": record["tenant"],
    }  # fmt: skip
    if "prompt_blocks" in record:
        attributes["prefixscope.prompt_blocks"] = record["prompt_blocks"]
    if "prompt_cache_key" in record:
        attributes["prefixscope.prompt_cache_key"] = record["prompt_cache_key"]
    if "response_headers" in record:
        attributes["prefixscope.semantic_cache_hit"] = True
    if "template" in record:
        attributes["prefixscope.template"] = record["template"]
    if "request_body" in record:  # recorded with content capture on
        attributes |= genai_content_attributes(record["request_body"])
    start = int(datetime.fromisoformat(record["arrived_at"]).timestamp() * 1e9)
    return Span(
        trace_id=bytes(16), span_id=bytes(8), name="chat", start_time_unix_nano=start,
        end_time_unix_nano=start + 10**9,
        attributes=[KeyValue(key=key, value=_value(value)) for key, value in attributes.items()],
    )  # fmt: skip


def otlp_export(requests: Sequence[HostedRequest]) -> bytes:
    """One OTLP/HTTP traces body (protobuf) holding the requests' GenAI spans."""
    spans = [genai_span(request) for request in requests]
    export = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
    body: bytes = export.SerializeToString()
    return body


async def report_hosted(
    session: aiohttp.ClientSession,
    requests: Sequence[HostedRequest],
    *,
    web_url: str,
    token: str,
    start: datetime,
    wait_until: Callable[[float], Awaitable[None]],
) -> int:
    """Send each record when its virtual second (from `start`) comes, over REST or OTLP as the record
    says; how many Prefixscope refused or could not be reached for (logged, never raised)."""
    auth = {"Authorization": f"Bearer {token}"}
    failed = 0
    for request in requests:
        await wait_until((datetime.fromisoformat(request.record["arrived_at"]) - start).total_seconds())
        if request.over_otlp:
            url, body = f"{web_url}/v1/traces", otlp_export([request])
            headers = {**auth, "Content-Type": "application/x-protobuf"}
        else:
            url, body = f"{web_url}/api/v1/requests", json.dumps([request.record]).encode()
            headers = {**auth, "Content-Type": "application/json"}
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status >= 400:
                    failed += 1
                    logger.warning("hosted usage refused by %s: HTTP %d", url, response.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            failed += 1
            logger.warning("hosted usage not sent to %s: %s", url, exc)
    return failed
