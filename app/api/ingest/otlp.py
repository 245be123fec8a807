"""OTLP/HTTP trace receiver: POST /v1/traces, protobuf or JSON, optionally gzip, with an ingest token.

Point vLLM's `--otlp-traces-endpoint` (or an application's OTLP exporter) at `<prefixscope>/v1/traces`
with `OTEL_EXPORTER_OTLP_TRACES_HEADERS="Authorization=Bearer <token>"`. A span names its server by the
`prefixscope.server` attribute (e.g. `OTEL_RESOURCE_ATTRIBUTES=prefixscope.server=vllm-0` on the vLLM
server); without one, the ingest token's name is taken as the server's name.
The answer is OTLP's ExportTraceServiceResponse, with rejected spans counted in partial_success.
Other answers: 400 (not an export, or not valid gzip), 401 (no live token), 413 (over 32 MiB,
decompressed too), and, with nothing stored and Retry-After set, 429 (busy: see admission.py) and
503 (no database); OTLP exporters send the export again.
"""

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from app.api.ingest.admission import (
    BadEncoding,
    BodyTooLarge,
    NotStored,
    admitted,
    bearer_token,
    read_body,
    retry_later,
    store_batch,
)
from app.traffic.models import RequestRecord
from app.traffic.services.requests import Malformed
from collectors.otlp.parse import REQUEST_ATTRIBUTES, OTLPDecodeError, Span, decode_export, span_request
from collectors.records import RequestFacts
from collectors.usage.parse import UsageError

SOURCE = RequestRecord.Source.OTLP.value


@csrf_exempt
@require_POST
def traces(request: HttpRequest) -> HttpResponse:
    token = bearer_token(request)
    if token is None:
        return HttpResponse(status=401, headers={"WWW-Authenticate": "Bearer"})
    with admitted(SOURCE) as admission:
        if not admission:
            return retry_later(429, None)
        return _ingest(request, default_server=token.name)


def _ingest(request: HttpRequest, *, default_server: str) -> HttpResponse:
    content_type = request.content_type or "application/x-protobuf"
    try:
        spans = decode_export(read_body(request), content_type, keys=REQUEST_ATTRIBUTES)
    except BodyTooLarge as exc:
        return HttpResponse(str(exc), status=413, content_type="text/plain")
    except (OTLPDecodeError, BadEncoding) as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    records, malformed = _records(spans, default_server=default_server)
    try:
        outcome = store_batch(
            records, source=SOURCE, default_server=default_server, malformed=[m for _, m in malformed]
        )
    except NotStored as exc:
        return retry_later(exc.status, None, retry_after=exc.retry_after)
    rejected = [f"span {name}: {m.reason}" for name, m in malformed] + [e for _, e in outcome.rejected]
    return _answer(content_type, rejected)


def _records(
    spans: list[Span], *, default_server: str
) -> tuple[list[RequestFacts], list[tuple[str, Malformed]]]:
    """Request facts of the spans that describe requests; the name of each malformed span, with
    what is wrong with it and the server it names (as a good span's, the token's name by default)."""
    records, rejected = [], []
    for span in spans:
        try:
            found = span_request(span)
        except UsageError as exc:
            server = span.attributes.get("prefixscope.server")
            server = server if isinstance(server, str) and server else default_server
            rejected.append((span.name, Malformed(source=SOURCE, reason=str(exc), server=server)))
            continue
        if found is not None:
            records.append(found)
    return records, rejected


def _answer(content_type: str, rejected: list[str]) -> HttpResponse:
    partial = ExportTracePartialSuccess(rejected_spans=len(rejected), error_message="; ".join(rejected[:10]))
    answer = ExportTraceServiceResponse(partial_success=partial if rejected else None)
    if content_type.startswith("application/json"):
        return HttpResponse(json_format.MessageToJson(answer), content_type="application/json")
    return HttpResponse(answer.SerializeToString(), content_type="application/x-protobuf")
