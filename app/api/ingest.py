"""REST bulk ingest of request records: a JSON array or JSON lines, authenticated by ingest token.

Good records are stored even when others in the batch are bad; the answer lists every bad one
by position with the field at fault (and is a 400 when there is any). 2xx only after commit.
"""

import json
import logging
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from ninja import Router, Status
from ninja.security import HttpBearer
from pydantic import ValidationError

from app.api.models import IngestToken
from app.api.schemas import ErrorAnswer, IngestAnswer, RequestRecordIn
from app.api.services import authenticate_ingest_token
from app.traffic.models import RequestRecord
from app.traffic.services.requests import RequestIn, ingest_request_records
from collectors.usage.parse import UsageError, usage_from

logger = logging.getLogger(__name__)
router = Router(tags=["ingest"])

MAX_RECORDS = 10_000
RETRY_AFTER_SECONDS = "5"


class IngestTokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> IngestToken | None:
        return authenticate_ingest_token(token)


BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "array", "items": RequestRecordIn.model_json_schema()}},
            "application/x-ndjson": {"schema": {"type": "string", "description": "one JSON record per line"}},
        },
    }
}


@router.post(
    "/requests",
    auth=IngestTokenAuth(),
    response={200: IngestAnswer, 400: IngestAnswer | ErrorAnswer, 413: ErrorAnswer, 503: ErrorAnswer},
    summary="Ingest request records",
    openapi_extra=BODY_DOC,
)
def ingest_requests(request: HttpRequest) -> Any:
    try:
        raw = split_records(request.body, request.content_type or "")
    except ValueError as exc:
        return Status(400, {"error": str(exc)})
    if len(raw) > MAX_RECORDS:
        return Status(413, {"error": f"at most {MAX_RECORDS} records per request; send smaller batches"})
    records, rejected = validate_records(raw)
    try:
        outcome = ingest_request_records([record for _, record in records], now=timezone.now())
    except (OperationalError, InterfaceError) as exc:
        logger.warning("request records not stored, database unavailable: %s", exc)
        return _unavailable()
    rejected += [(records[i][0], reason) for i, reason in outcome.rejected]
    answer = {"stored": outcome.stored, "rejected": [{"index": i, "error": e} for i, e in sorted(rejected)]}
    return Status(400 if rejected else 200, answer)


def split_records(body: bytes, content_type: str) -> list[Any]:
    """The records of a JSON array, or of JSON lines (blank lines skipped). ValueError names the line."""
    if "ndjson" in content_type or "jsonl" in content_type:
        records = []
        for number, line in enumerate(body.decode("utf-8", "replace").splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"line {number}: not JSON ({exc.msg})") from None
        return records
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"body: not JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(parsed, list):
        raise ValueError("body: expected a JSON array of records (or JSON lines)")
    return parsed


def validate_records(raw: list[Any]) -> tuple[list[tuple[int, RequestIn]], list[tuple[int, str]]]:
    """Valid records with their batch position, and the rest with the field at fault."""
    records, rejected = [], []
    for index, item in enumerate(raw):
        try:
            records.append((index, to_request(RequestRecordIn.model_validate(item))))
        except ValidationError as exc:
            first = exc.errors()[0]
            rejected.append((index, f"{'.'.join(str(p) for p in first['loc']) or 'record'}: {first['msg']}"))
        except UsageError as exc:
            rejected.append((index, str(exc)))
    return records, rejected


def to_request(record: RequestRecordIn) -> RequestIn:
    """The service's input; fields given explicitly win over the usage object."""
    usage = usage_from(record.usage or {})
    if record.arrived_at.tzinfo is None:
        raise ValidationError.from_exception_data(
            "RequestRecordIn",
            [{"type": "timezone_aware", "loc": ("arrived_at",), "input": str(record.arrived_at)}],
        )
    data = record.model_dump(exclude={"usage"})
    data["prompt_tokens"] = _first(record.prompt_tokens, usage.prompt_tokens)
    data["cached_tokens"] = _first(record.cached_tokens, usage.cached_tokens)
    data["completion_tokens"] = _first(record.completion_tokens, usage.completion_tokens)
    return RequestIn(source=RequestRecord.Source.REST, **data)


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _unavailable() -> JsonResponse:
    response = JsonResponse({"error": "the database is unavailable; retry later"}, status=503)
    response["Retry-After"] = RETRY_AFTER_SECONDS
    return response
