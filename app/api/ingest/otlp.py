"""OTLP/HTTP trace receiver: POST /v1/traces, protobuf or JSON, optionally gzip, with an ingest token.

Point vLLM's `--otlp-traces-endpoint` (or an application's OTLP exporter) at `<prefixscope>/v1/traces`
with `OTEL_EXPORTER_OTLP_TRACES_HEADERS="Authorization=Bearer <token>"`. A span names its server by the
`prefixscope.server` attribute (e.g. `OTEL_RESOURCE_ATTRIBUTES=prefixscope.server=vllm-0` on the vLLM
server); without one, the ingest token's name is taken as the server's name.
The answer is OTLP's ExportTraceServiceResponse, with rejected spans counted in partial_success.
Other answers: 400 (not an export, or not valid gzip), 401 (no live token), 405 (not a POST), 413
(over 32 MiB, decompressed too), 415 (neither protobuf nor JSON), each with a google.rpc.Status in
the request's encoding as OTLP/HTTP says (JSON: `{"code": 3, "message": "..."}`), and, with nothing
stored and Retry-After set, 429 (busy: see admission.py) and 503 (no database); OTLP exporters send
the export again. Documented in the API's OpenAPI schema (app/api/openapi.py).
"""

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
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
from collectors.errors import RejectReason
from collectors.otlp.parse import REQUEST_ATTRIBUTES, OTLPDecodeError, Span, decode_export, span_request
from collectors.parts import PartsError, digest_key
from collectors.records import RequestFacts
from collectors.usage.parse import UsageError

SOURCE = RequestRecord.Source.OTLP.value


PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# gRPC's status codes, as OTLP's google.rpc.Status carries them.
INVALID_ARGUMENT, UNAUTHENTICATED, UNIMPLEMENTED = 3, 16, 12


@csrf_exempt
def traces(request: HttpRequest) -> HttpResponse:
    encoding = JSON if (request.content_type or "").startswith(JSON) else PROTOBUF
    if request.method != "POST":
        refused = _failure(
            encoding, 405, UNIMPLEMENTED, f"{request.method} is not allowed here; POST an export"
        )
        refused["Allow"] = "POST"
        return refused
    token = bearer_token(request)
    if token is None:
        refused = _failure(encoding, 401, UNAUTHENTICATED, "no live ingest token: send Authorization: Bearer")
        refused["WWW-Authenticate"] = "Bearer"
        return refused
    if request.content_type not in ("", PROTOBUF, JSON):
        message = f"send {PROTOBUF} or {JSON}, not {request.content_type}"
        return _failure(encoding, 415, INVALID_ARGUMENT, message)
    with admitted(SOURCE) as admission:
        if not admission:
            return retry_later(429, None)
        return _ingest(request, default_server=token.name)


def _ingest(request: HttpRequest, *, default_server: str) -> HttpResponse:
    content_type = request.content_type or PROTOBUF
    encoding = JSON if content_type.startswith(JSON) else PROTOBUF
    try:
        spans = decode_export(read_body(request), content_type, keys=REQUEST_ATTRIBUTES)
    except BodyTooLarge as exc:
        return _failure(encoding, 413, INVALID_ARGUMENT, str(exc))
    except (OTLPDecodeError, BadEncoding) as exc:
        return _failure(encoding, 400, INVALID_ARGUMENT, str(exc))
    records, malformed = _records(spans, default_server=default_server)
    try:
        outcome = store_batch(
            records, source=SOURCE, default_server=default_server, malformed=[m for _, m in malformed]
        )
    except NotStored as exc:
        return retry_later(exc.status, None, retry_after=exc.retry_after)
    rejected = [f"span {name}: {m.detail}" for name, m in malformed] + [e.detail for _, e in outcome.rejected]
    return _answer(content_type, rejected)


def _records(
    spans: list[Span], *, default_server: str
) -> tuple[list[RequestFacts], list[tuple[str, Malformed]]]:
    """Request facts of the spans that describe requests; the name of each malformed span, with
    what is wrong with it and the server it names (as a good span's, the token's name by default)."""
    records, rejected = [], []
    key = digest_key(settings.SECRET_KEY)
    for span in spans:
        try:
            found = span_request(span, digest_key=key)
        except (UsageError, PartsError) as exc:
            server = span.attributes.get("prefixscope.server")
            server = server if isinstance(server, str) and server else default_server
            code = RejectReason.PARTS_INVALID if isinstance(exc, PartsError) else RejectReason.USAGE_INVALID
            rejected.append((span.name, Malformed(source=SOURCE, code=code, detail=str(exc), server=server)))
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


def _failure(encoding: str, status: int, code: int, message: str) -> HttpResponse:
    """An error as OTLP/HTTP answers one: a google.rpc.Status in the request's encoding."""
    answer = Status(code=code, message=message)
    if encoding == JSON:
        return HttpResponse(json_format.MessageToJson(answer), status=status, content_type=JSON)
    return HttpResponse(answer.SerializeToString(), status=status, content_type=PROTOBUF)
