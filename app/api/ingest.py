"""REST bulk ingest of request records: a JSON array or JSON lines, authenticated by ingest token.

Good records are stored even when others in the batch are bad; the answer lists every bad one
by position with the field at fault (and is a 400 when there is any). 2xx only after commit.
"""

import logging
import re
from typing import Any

import msgspec
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from ninja import Router, Status
from ninja.security import HttpBearer

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
from app.api.models import IngestToken
from app.api.schemas import (
    ErrorAnswer,
    IngestAnswer,
    RequestRecordIn,
    Unauthorized,
    request_record_json_schema,
)
from app.api.services import authenticate_ingest_token
from app.traffic.models import RequestRecord
from app.traffic.services.requests import Malformed, RequestIn, ingest_request_records
from collectors.usage.parse import UsageError, usage_from

logger = logging.getLogger(__name__)
router = Router(tags=["ingest"])

SOURCE = RequestRecord.Source.REST.value
MAX_RECORDS = 10_000
RETRY_AFTER_SECONDS = "5"
_MISSING = re.compile(r"missing required field `([^`]+)`")


class IngestTokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> IngestToken | None:
        return authenticate_ingest_token(token)


BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "array", "items": request_record_json_schema()}},
            "application/x-ndjson": {"schema": {"type": "string", "description": "one JSON record per line"}},
        },
    }
}


@router.post(
    "/requests",
    auth=IngestTokenAuth(),
    response={
        200: IngestAnswer, 400: IngestAnswer | ErrorAnswer, 401: Unauthorized, 413: ErrorAnswer,
        429: ErrorAnswer, 503: ErrorAnswer,
    },
    summary="Ingest request records",
    description=(
        "200: every record stored. 400: the records listed were rejected, the others stored (or the body is "
        "not JSON: nothing stored). 401: no live ingest token. 413: more than 10,000 records or 32 MiB. "
        "429: busy (too many batches at once, or the database did not take this one in time): nothing "
        "stored, send it again after Retry-After seconds. 503: the database is unavailable: nothing stored, "
        "send it again after Retry-After seconds. Sending a batch again is safe: records merge by key."
    ),
    openapi_extra=BODY_DOC,
)  # fmt: skip
def ingest_requests(request: HttpRequest) -> Any:
    with ingest_slot(SOURCE) as admitted:
        if not admitted:
            return busy_response("this process is ingesting as many batches as it may; retry later")
        answer = _ingest(request)
    record_refusals()
    return answer


def _ingest(request: HttpRequest) -> Any:
    try:
        records, rejected = decode_records(read_body(request), request.content_type or "")
    except BodyTooLarge as exc:
        return Status(413, {"error": str(exc)})
    except ValueError as exc:
        return Status(400, {"error": str(exc)})
    if len(records) + len(rejected) > MAX_RECORDS:
        return Status(413, {"error": f"at most {MAX_RECORDS} records per request; send smaller batches"})
    malformed = [
        Malformed(source=SOURCE, reason=_INDEX.sub("[]", e), server=server) for _, e, server in rejected
    ]
    try:
        outcome = ingest_request_records(
            [record for _, record in records], now=timezone.now(), malformed=malformed
        )
    except (OperationalError, InterfaceError) as exc:
        return _not_stored(exc)
    answered = [(i, e) for i, e, _ in rejected] + [(records[i][0], e) for i, e in outcome.rejected]
    answer = {"stored": outcome.stored, "rejected": [{"index": i, "error": e} for i, e in sorted(answered)]}
    return Status(400 if answered else 200, answer)


# A bad record: its position in the batch, the field at fault, and the server it names ("" if none).
Rejected = tuple[int, str, str]
Decoded = tuple[list[tuple[int, RequestIn]], list[Rejected]]
_batch = msgspec.json.Decoder(list[RequestRecordIn], strict=False)
_items = msgspec.json.Decoder(list[msgspec.Raw])
_record = msgspec.json.Decoder(RequestRecordIn, strict=False)
_any = msgspec.json.Decoder()
# Positions in a field's path (prompt_token_ids[7]) are dropped from the tally's reasons: one
# reason per field and fault, not one per token.
_INDEX = re.compile(r"\[\d+\]")


def decode_records(body: bytes, content_type: str) -> Decoded:
    """Valid records with their batch position, and the rest with the field at fault.

    A JSON array, or JSON lines (blank lines skipped). ValueError when the body (or a line) is not JSON.
    `strict=False`: numbers may come as strings and arrival times as Unix seconds, as pydantic allowed.
    """
    if "ndjson" in content_type or "jsonl" in content_type:
        lines = [(f"line {n}", line) for n, line in enumerate(body.splitlines(), start=1) if line.strip()]
        return _validated(lines)
    try:
        return _validated_records(list(enumerate(_batch.decode(body))), [])
    except msgspec.ValidationError:
        pass  # some record is bad (or the body is not an array): decode one record at a time
    except msgspec.DecodeError as exc:
        raise ValueError(f"body: not JSON ({exc})") from None
    try:
        items = _items.decode(body)
    except msgspec.ValidationError:
        raise ValueError("body: expected a JSON array of records (or JSON lines)") from None
    return _validated([(f"record {n}", item) for n, item in enumerate(items)])


def _validated(items: list[tuple[str, Any]]) -> Decoded:
    """Decoded one by one: (where, JSON text) in, a bad record rejected, a line that is not JSON refused."""
    records, rejected = [], []
    for index, (where, item) in enumerate(items):
        try:
            records.append((index, _record.decode(item)))
        except msgspec.ValidationError as exc:
            rejected.append((index, field_error(exc), _server_named(item)))
        except msgspec.DecodeError as exc:  # only a JSON line can be malformed: the array was parsed
            raise ValueError(f"{where}: not JSON ({exc})") from None
    return _validated_records(records, rejected)


def _validated_records(records: list[tuple[int, RequestRecordIn]], rejected: list[Rejected]) -> Decoded:
    requests = []
    for index, record in records:
        try:
            requests.append((index, to_request(record)))
        except UsageError as exc:
            rejected.append((index, str(exc), record.server))
    return requests, rejected


def _server_named(item: bytes | msgspec.Raw) -> str:
    """The server a record that is not valid names, when it names one as a string."""
    record = _any.decode(item)  # JSON: a record that is not is refused before
    server = record.get("server") if isinstance(record, dict) else None
    return server if isinstance(server, str) else ""


def field_error(exc: msgspec.ValidationError) -> str:
    """msgspec's message led by the field at fault: `prompt_tokens: Expected `int | null`, got `str``."""
    message, _, path = str(exc).partition(" - at `$")
    field = path.rstrip("`").lstrip(".")
    if not field:
        missing = _MISSING.search(message)
        field = missing.group(1) if missing else "record"
    return f"{field}: {message}"


def to_request(record: RequestRecordIn) -> RequestIn:
    """The service's input; fields given explicitly win over the usage object."""
    prompt, cached, completion = record.prompt_tokens, record.cached_tokens, record.completion_tokens
    if record.usage:
        usage = usage_from(record.usage)
        prompt = prompt if prompt is not None else usage.prompt_tokens
        cached = cached if cached is not None else usage.cached_tokens
        completion = completion if completion is not None else usage.completion_tokens
    return RequestIn(
        server=record.server, request_id=record.request_id, arrived_at=record.arrived_at,
        source=RequestRecord.Source.REST, trace_id=record.trace_id, model=record.model, tenant=record.tenant,
        template=record.template, template_version=record.template_version, ttft_seconds=record.ttft_seconds,
        queue_seconds=record.queue_seconds, prefill_seconds=record.prefill_seconds,
        prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
        cache_salt=record.cache_salt, prompt_token_ids=record.prompt_token_ids,
    )  # fmt: skip


def _not_stored(exc: OperationalError | InterfaceError) -> HttpResponse:
    """429 when the database is there but gave up on the batch, 503 when it is away; both: retry."""
    if database_busy(exc):
        logger.warning("request records not stored, database busy: %s", exc)
        note_refusal(SOURCE, DATABASE_BUSY)
        return busy_response("the database did not take the batch in time; retry later")
    logger.warning("request records not stored, database unavailable: %s", exc)
    response = JsonResponse({"error": "the database is unavailable; retry later"}, status=503)
    response["Retry-After"] = RETRY_AFTER_SECONDS
    return response
