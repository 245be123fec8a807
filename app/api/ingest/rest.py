"""REST bulk ingest of request records: a JSON array or JSON lines, optionally gzip (`Content-Encoding:
gzip`), authenticated by ingest token.

Good records are stored even when others in the batch are bad; the answer lists every bad one
by position with the field at fault (and is a 400 when there is any). 2xx only after commit.
"""

import json
import re
from collections.abc import Sequence
from typing import Any, NamedTuple, get_type_hints

import msgspec
import numpy as np
import numpy.typing as npt
from django.conf import settings
from django.http import HttpRequest
from ninja import Router, Status
from ninja.security import HttpBearer

from app.api.errors import ApiError, error
from app.api.ingest.admission import (
    BodyTooLarge,
    NotStored,
    admitted,
    bearer_token,
    read_body,
    retry_later,
    store_batch,
)
from app.api.models import IngestToken
from app.api.schemas import INTEGER_MAX, IngestAnswer, RequestRecordIn, request_record_json_schema
from app.domain.blockhash import TokenIds
from app.traffic.models import RequestRecord
from app.traffic.services.requests import Malformed
from collectors.errors import RejectReason
from collectors.parts import PartDigests, PartsError, body_digests, content_blocks, digest_key
from collectors.records import PROMPT_BLOCKS_MAX, SERVER_MAX, RequestFacts, canonical_request_id
from collectors.usage.parse import UsageError, gateway_cache_hit, ttl_seconds, usage_from

router = Router(tags=["ingest"])

SOURCE = RequestRecord.Source.REST.value
MAX_RECORDS = 10_000
_MISSING = re.compile(r"missing required field `([^`]+)`")


class IngestTokenAuth(HttpBearer):
    """The ingest token (admission.bearer_token), for django-ninja and its OpenAPI schema.

    HttpBearer's own `__call__` logs a header of another scheme whole, at ERROR, when DEBUG is on: a
    token sent without `Bearer ` went to the log. So the header is read by admission.
    """

    def __call__(self, request: HttpRequest) -> IngestToken | None:
        return bearer_token(request)

    def authenticate(self, request: HttpRequest, token: str) -> IngestToken | None:
        raise AssertionError("unused: __call__ reads the header")  # HttpBearer declares it abstract


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
        200: IngestAnswer, 400: IngestAnswer | ApiError, 401: ApiError, 413: ApiError,
        429: ApiError, 503: ApiError,
    },
    summary="Ingest request records",
    description=(
        "200: every record stored. 400: the records listed were rejected, the others stored (or the body is "
        "not JSON or not valid gzip: nothing stored). 401: no live ingest token. 413: more than 10,000 "
        "records or 32 MiB (a `Content-Encoding: gzip` body: once inflated). "
        "429: busy (too many batches at once, or the database did not take this one in time): nothing "
        "stored, send it again after Retry-After seconds. 503: the database is unavailable: nothing stored, "
        "send it again after Retry-After seconds. Sending a batch again is safe: records merge by key."
    ),
    openapi_extra=BODY_DOC,
)  # fmt: skip
def ingest_requests(request: HttpRequest) -> Any:
    with admitted(SOURCE) as admission:
        if not admission:
            return retry_later(429, "this process is ingesting as many batches as it may; retry later")
        return _ingest(request)


def _ingest(request: HttpRequest) -> Any:
    try:
        records, rejected = decode_records(read_body(request), request.content_type or "")
    except BodyTooLarge as exc:
        return error(413, str(exc))
    except ValueError as exc:
        return error(400, str(exc), code="bad_body")
    if len(records) + len(rejected) > MAX_RECORDS:
        return error(413, f"at most {MAX_RECORDS} records per request; send smaller batches")
    malformed = [
        Malformed(source=SOURCE, code=bad.code, detail=_INDEX.sub("[]", bad.reason), server=bad.server)
        for bad in rejected
    ]
    try:
        outcome = store_batch([record for _, record in records], source=SOURCE, malformed=malformed)
    except NotStored as exc:
        return retry_later(exc.status, exc.reason, retry_after=exc.retry_after)
    answered = [(bad.position, bad.reason) for bad in rejected] + [
        (records[i][0], e.detail) for i, e in outcome.rejected
    ]
    answer = {"stored": outcome.stored, "rejected": [{"index": i, "error": e} for i, e in sorted(answered)]}
    return Status(400 if answered else 200, answer)


class Rejected(NamedTuple):
    """A bad record: its position in the batch, the field at fault, and the server it names."""

    position: int
    code: RejectReason
    reason: str
    server: str  # "" when it names none


class Decoded(NamedTuple):
    """A batch's good records with their positions, and its bad ones."""

    records: list[tuple[int, RequestFacts]]
    rejected: list[Rejected]


_batch = msgspec.json.Decoder(list[RequestRecordIn], strict=False)
_items = msgspec.json.Decoder(list[msgspec.Raw])
_record = msgspec.json.Decoder(RequestRecordIn, strict=False)
_any = msgspec.json.Decoder()
NOT_JSON = "record: not JSON (or not UTF-8)"
# Positions in a field's path (prompt_token_ids[7]) are dropped from the tally's reasons: one
# reason per field and fault, not one per token.
_INDEX = re.compile(r"\[\d+\]")


def decode_records(body: bytes, content_type: str) -> Decoded:
    """Valid records with their batch position, and the rest with the field at fault.

    A JSON array, or JSON lines (blank lines skipped; a line that is not JSON is rejected alone).
    ValueError when the body is not JSON, or not an array. `strict=False`: numbers may come as
    strings and arrival times as Unix seconds, as pydantic allowed.
    """
    if "ndjson" in content_type or "jsonl" in content_type:
        return _validated([line for line in body.splitlines() if line.strip()])
    fast = _read_fast(body)
    if fast is not None:
        return fast
    try:
        return _validated_records(list(enumerate(_batch.decode(body))), [])
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass  # some record is bad, or the body is not an array (or not JSON): one record at a time
    try:
        items: list[Any] = _items.decode(body)
    except msgspec.ValidationError:
        raise ValueError("body: expected a JSON array of records (or JSON lines)") from None
    except msgspec.DecodeError as exc:
        items = _read_by_python(body, exc)
    return _validated(items)


class _RecordOfRawIds(RequestRecordIn, kw_only=True):
    """A record whose token ids are left as JSON text, for _token_ids."""

    prompt_token_ids: msgspec.Raw = msgspec.Raw(b"null")  # type: ignore[assignment]


_batch_of_raw_ids = msgspec.json.Decoder(list[_RecordOfRawIds], strict=False)
_token_ids_as_declared = msgspec.json.Decoder(
    get_type_hints(RequestRecordIn, include_extras=True)["prompt_token_ids"], strict=False
)
_DIGITS_AND_COMMAS = b"0123456789,"


def _read_fast(body: bytes) -> Decoded | None:
    """A JSON array of valid records whose token ids are all plain decimal integers in range, read
    with their token ids straight into numpy (msgspec made a Python int of each: most of an 8K-token
    prompt's decoding time, and the ingest then converted them to numpy). None for any other body:
    the strict decoder reads it, and names each fault as before."""
    try:
        found = _batch_of_raw_ids.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    token_ids = [_token_ids(record.prompt_token_ids) for record in found]
    if any(ids is _NOT_PLAIN for ids in token_ids):
        return None
    return _validated_records(list(enumerate(found)), [], token_ids=token_ids)


_NOT_PLAIN = np.empty(0, np.int64)


def _token_ids(raw: msgspec.Raw) -> npt.NDArray[np.int64] | None:
    """A record's token ids (valid JSON: msgspec read it) as int64, None for null. An array of digits
    and commas only, as encoders write token ids, is integers without leading zeros: numpy parses it
    whole. Another (spaces, signs) is read as the strict decoder reads it. _NOT_PLAIN for an id
    beyond PostgreSQL's integer or any other fault: the strict decoder then names it."""
    text = bytes(raw)
    inside = text[1:-1]
    if text[:1] == b"[" and inside and not inside.translate(None, _DIGITS_AND_COMMAS):
        ids = np.fromstring(inside, dtype=np.int64, sep=",")  # an id beyond int64 reads as its maximum
        return ids if ids.max() <= INTEGER_MAX else _NOT_PLAIN
    try:
        found = _token_ids_as_declared.decode(text)
    except msgspec.ValidationError:
        return _NOT_PLAIN
    return None if found is None else np.array(found, np.int64)


def _read_by_python(body: bytes, exc: msgspec.DecodeError) -> list[Any]:
    """The array as Python's own JSON reader reads it: it keeps a lone surrogate escape (`\\ud800`),
    which msgspec refuses for the whole body, so that only the record holding one is rejected."""
    try:
        found = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError(f"body: not JSON ({exc})") from None
    if not isinstance(found, list):
        raise ValueError("body: expected a JSON array of records (or JSON lines)")
    return found


def _validated(items: list[Any]) -> Decoded:
    """Decoded one by one (JSON text, or what Python's reader made of it); a bad record rejected."""
    records: list[tuple[int, RequestRecordIn]] = []
    rejected: list[Rejected] = []
    for index, item in enumerate(items):
        try:
            records.append((index, _record_of(item)))
        except msgspec.ValidationError as exc:
            rejected.append(
                Rejected(index, RejectReason.FIELD_INVALID, field_error(exc), _server_named(item))
            )
        except msgspec.DecodeError:
            rejected.append(Rejected(index, RejectReason.BODY_INVALID, NOT_JSON, ""))
    return _validated_records(records, rejected)


def _record_of(item: Any) -> RequestRecordIn:
    if not isinstance(item, bytes | msgspec.Raw):
        return msgspec.convert(item, RequestRecordIn, strict=False)
    try:
        return _record.decode(item)
    except msgspec.DecodeError as exc:
        not_json = exc
    try:
        found = json.loads(bytes(item))  # a lone surrogate escape, as above
    except (ValueError, RecursionError):
        raise not_json from None  # not JSON, or not UTF-8
    return msgspec.convert(found, RequestRecordIn, strict=False)


def _validated_records(
    records: list[tuple[int, RequestRecordIn]],
    rejected: list[Rejected],
    *,
    token_ids: Sequence[npt.NDArray[np.int64] | None] | None = None,
) -> Decoded:
    """The records' facts, and the rejected with those whose usage or request body is not valid;
    `token_ids`: each record's, read apart from it (_read_fast)."""
    requests = []
    key = digest_key(settings.SECRET_KEY)
    for position, (index, record) in enumerate(records):
        try:
            ids = record.prompt_token_ids if token_ids is None else token_ids[position]
            requests.append((index, to_facts(record, ids, digest_key=key)))
        except UsageError as exc:
            rejected.append(Rejected(index, RejectReason.USAGE_INVALID, str(exc), record.server))
        except PartsError as exc:
            rejected.append(Rejected(index, RejectReason.PARTS_INVALID, str(exc), record.server))
    return Decoded(requests, rejected)


def _server_named(item: Any) -> str:
    """The server a record that is not valid names, when it names one as a string."""
    if isinstance(item, bytes | msgspec.Raw):
        try:
            item = _any.decode(item)
        except msgspec.DecodeError:
            item = json.loads(bytes(item))  # _record_of read it so
    server = item.get("server") if isinstance(item, dict) else None
    return server if isinstance(server, str) and len(server) <= SERVER_MAX else ""


def field_error(exc: msgspec.ValidationError) -> str:
    """msgspec's message led by the field at fault: `prompt_tokens: Expected `int | null`, got `str``."""
    message, _, path = str(exc).partition(" - at `$")
    field = path.rstrip("`").lstrip(".")
    if not field:
        missing = _MISSING.search(message)
        field = missing.group(1) if missing else "record"
    return f"{field}: {message}"


def to_facts(record: RequestRecordIn, token_ids: TokenIds | None, *, digest_key: bytes) -> RequestFacts:
    """The record's facts under its canonical request id; fields given explicitly win over `usage`.
    `token_ids`: its prompt token ids, a list or numpy int64 (what the ingest converts a list to
    anyway, app.domain.blockhash.int64_ids). Its request body, if any, is kept only as its parts'
    digests (with `digest_key`), and a hosted API's record that sent no `prompt_blocks` gets them
    (and its markers) from it; raises PartsError for a body that is not a chat request's."""
    prompt, cached, completion = record.prompt_tokens, record.cached_tokens, record.completion_tokens
    written, provider = record.cache_write_tokens, record.provider
    ttl = ttl_seconds(record.cache_ttl, "cache_ttl") if record.cache_ttl is not None else None
    if record.usage:
        usage = usage_from(record.usage)
        prompt = prompt if prompt is not None else usage.prompt_tokens
        cached = cached if cached is not None else usage.cached_tokens
        completion = completion if completion is not None else usage.completion_tokens
        written = written if written is not None else usage.cache_write_tokens
        ttl = ttl if ttl is not None else usage.cache_ttl_seconds
        provider = provider or usage.provider
    gateway_hit = record.semantic_cache_hit
    if gateway_hit is None and record.response_headers:
        gateway_hit = gateway_cache_hit(record.response_headers)
    client_ttft = (
        record.client_ttft_seconds if record.client_ttft_seconds is not None else record.ttft_seconds
    )
    parts: PartDigests | None = None
    blocks, breakpoints = record.prompt_blocks, record.cache_breakpoints
    if record.request_body is not None:
        parts = body_digests(record.request_body, key=digest_key)
        if provider and not blocks:  # a hosted prompt's blocks, as its provider caches them
            blocks, breakpoints = content_blocks(record.request_body, key=digest_key, limit=PROMPT_BLOCKS_MAX)
    return RequestFacts(
        server=record.server,
        request_id=canonical_request_id(record.request_id),
        arrived_at=record.arrived_at,
        trace_id=record.trace_id,
        model=record.model,
        tenant=record.tenant,
        template=record.template,
        template_version=record.template_version,
        client_ttft_seconds=client_ttft,
        server_ttft_seconds=record.server_ttft_seconds,
        queue_seconds=record.queue_seconds,
        prefill_seconds=record.prefill_seconds,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        cache_salt=record.cache_salt,
        prompt_token_ids=token_ids,  # type: ignore[arg-type]  # RequestFacts from REST are never encoded
        provider=provider,
        cache_write_tokens=written,
        cache_ttl_seconds=ttl,
        prompt_cache_key=record.prompt_cache_key,
        prompt_blocks=blocks,
        cache_breakpoints=breakpoints,
        gateway_cache_hit=gateway_hit,
        parts=parts,
    )
