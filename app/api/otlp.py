"""OTLP/HTTP trace receiver: POST /v1/traces, protobuf or JSON, optionally gzip, with an ingest token.

Point vLLM's `--otlp-traces-endpoint` (or an application's OTLP exporter) at `<prefixscope>/v1/traces`
with `OTEL_EXPORTER_OTLP_TRACES_HEADERS="Authorization=Bearer <token>"`. A span names its server by the
`prefixscope.server` attribute (e.g. `OTEL_RESOURCE_ATTRIBUTES=prefixscope.server=vllm-0` on the vLLM
server); without one, the ingest token's name is taken as the server's name.
The answer is OTLP's ExportTraceServiceResponse, with rejected spans counted in partial_success.
Other answers: 400 (not an export), 401 (no live token), 413 (over 32 MiB, decompressed too), and,
with nothing stored and Retry-After set, 429 (busy: see app/api/intake.py) and 503 (no database);
OTLP exporters send the export again.
"""

import gzip
import logging
import zlib

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from app.api import intake
from app.api.intake import (
    DATABASE_BUSY,
    BodyTooLarge,
    busy_response,
    database_busy,
    ingest_slot,
    note_refusal,
    read_body,
    record_refusals,
)
from app.api.services import authenticate_ingest_token
from app.traffic.models import RequestRecord
from app.traffic.services.requests import Malformed, RequestIn, ingest_request_records
from collectors.otlp.parse import REQUEST_ATTRIBUTES, OTLPDecodeError, Span, decode_export, span_request
from collectors.usage.parse import UsageError

logger = logging.getLogger(__name__)
SOURCE = RequestRecord.Source.OTLP.value


@csrf_exempt
@require_POST
def traces(request: HttpRequest) -> HttpResponse:
    bearer = request.headers.get("Authorization", "")
    token = (
        authenticate_ingest_token(bearer.removeprefix("Bearer ").strip())
        if bearer.startswith("Bearer ")
        else None
    )
    if token is None:
        return HttpResponse(status=401, headers={"WWW-Authenticate": "Bearer"})
    with ingest_slot(SOURCE) as admitted:
        if not admitted:
            return busy_response(None)
        answer = _ingest(request, default_server=token.name)
    record_refusals()
    return answer


def _ingest(request: HttpRequest, *, default_server: str) -> HttpResponse:
    content_type = request.content_type or "application/x-protobuf"
    try:
        spans = decode_export(_body(request), content_type, keys=REQUEST_ATTRIBUTES)
    except BodyTooLarge as exc:
        return HttpResponse(str(exc), status=413, content_type="text/plain")
    except (OTLPDecodeError, OSError, EOFError, zlib.error) as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    records, malformed = _records(spans, default_server=default_server)
    try:
        outcome = ingest_request_records(records, now=timezone.now(), malformed=[m for _, m in malformed])
    except (OperationalError, InterfaceError) as exc:
        if database_busy(exc):
            logger.warning("spans not stored, database busy: %s", exc)
            note_refusal(SOURCE, DATABASE_BUSY)
            return busy_response(None)
        logger.warning("spans not stored, database unavailable: %s", exc)
        return HttpResponse(status=503, headers={"Retry-After": "5"})
    rejected = [f"span {name}: {m.reason}" for name, m in malformed] + [e for _, e in outcome.rejected]
    return _answer(content_type, rejected)


def _body(request: HttpRequest) -> bytes:
    body = read_body(request)
    if request.headers.get("Content-Encoding", "").lower() == "gzip":
        body = gzip.decompress(body)
    if len(body) > intake.MAX_BODY_BYTES:
        raise BodyTooLarge(f"body larger than {intake.MAX_BODY_BYTES} bytes once decompressed")
    return body


def _records(
    spans: list[Span], *, default_server: str
) -> tuple[list[RequestIn], list[tuple[str, Malformed]]]:
    """Request records of the spans that describe requests; the name of each malformed span, with
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
        if found is None:
            continue
        usage = found.usage
        records.append(
            RequestIn(
                server=found.server or default_server,
                request_id=found.request_id,
                arrived_at=found.arrived_at,
                source=RequestRecord.Source.OTLP,
                trace_id=found.trace_id,
                model=found.model,
                tenant=found.tenant,
                template=found.template,
                template_version=found.template_version,
                ttft_seconds=found.ttft_seconds,
                queue_seconds=found.queue_seconds,
                prefill_seconds=found.prefill_seconds,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
            )
        )
    return records, rejected


def _answer(content_type: str, rejected: list[str]) -> HttpResponse:
    partial = ExportTracePartialSuccess(rejected_spans=len(rejected), error_message="; ".join(rejected[:10]))
    answer = ExportTraceServiceResponse(partial_success=partial if rejected else None)
    if content_type.startswith("application/json"):
        return HttpResponse(json_format.MessageToJson(answer), content_type="application/json")
    return HttpResponse(answer.SerializeToString(), content_type="application/x-protobuf")
