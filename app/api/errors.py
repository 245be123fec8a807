"""One error shape for the whole REST API: `{"code": "...", "message": "...", "fields": {...}}`.

`code` is a stable word a script can branch on, `message` a sentence for a person, `fields` what is
wrong with each parameter or body field ({} when the error is not about one). django-ninja's own
answers (its validation errors, a failed authentication or CSRF check, an unknown method, a body it
cannot parse) are turned into the same shape by the handlers installed here. A bad parameter or
field is a 400 on every route, django-ninja's validation included (its own status would be 422).
"""

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import DataError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import Field, NinjaAPI, Schema, Status
from ninja.errors import HttpError, ValidationError

logger = logging.getLogger(__name__)

# The code of an error that has no more specific one, by HTTP status.
CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    429: "busy",
    503: "unavailable",
}
UNAUTHORIZED = "log in, or send a live token as `Authorization: Bearer <token>`"


class ApiError(Schema):
    code: str = Field(
        description="A stable word to branch on: bad_request, bad_filter, bad_cursor, unauthorized, "
        "forbidden, not_found, method_not_allowed, conflict, too_large, unsupported_media_type, invalid, "
        "busy, unavailable, ..."
    )
    message: str = Field(description="What went wrong, for a person")
    fields: dict[str, list[str]] = Field(
        default_factory=dict, description="What is wrong with each parameter or field; {} when none"
    )


def error_body(
    status: int, message: str, *, code: str = "", fields: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """The error document; `code` defaults to the status' own."""
    return {"code": code or CODES.get(status, "error"), "message": message, "fields": fields or {}}


def error(
    status: int, message: str, *, code: str = "", fields: dict[str, list[str]] | None = None
) -> Status[dict[str, Any]]:
    """An operation's error answer (its `response` declares ApiError for `status`)."""
    return Status(status, error_body(status, message, code=code, fields=fields))


def error_response(
    status: int, message: str, *, code: str = "", fields: dict[str, list[str]] | None = None
) -> JsonResponse:
    """The error as a plain Django response, for views and handlers outside an operation."""
    return JsonResponse(error_body(status, message, code=code, fields=fields), status=status)


class UnsupportedMediaType(ValueError):
    """A body sent as something other than JSON to an operation that reads JSON."""


def _validation_error(request: HttpRequest, exc: Any) -> HttpResponse:  # ValidationError
    # A 400, as every other bad parameter of the API (and the routes that check their own): one
    # status for a script to handle, `code` telling a type or range error (invalid) from the others.
    fields: dict[str, list[str]] = {}
    for problem in exc.errors:
        # ninja's location: ("query", "limit"), ("body", "body", "a", "text"), ("path", "id")
        where = [str(part) for part in problem.get("loc", ())[1:] if part != "body"]
        fields.setdefault(".".join(where) or "body", []).append(str(problem.get("msg", "not valid")))
    return error_response(400, "some parameters or fields are not valid", code="invalid", fields=fields)


def _http_error(request: HttpRequest, exc: Any) -> HttpResponse:  # HttpError
    if isinstance(exc.__cause__, UnsupportedMediaType):
        return error_response(415, str(exc.__cause__))
    status, message = exc.status_code, str(exc)
    if status == 401:
        message = UNAUTHORIZED
    elif status == 400 and message.startswith("Cannot parse request body"):
        return error_response(400, "the body is not JSON", code="bad_body")
    elif status == 403 and "CSRF" in message:
        return error_response(403, "CSRF check failed: send Django's CSRF token as X-CSRFToken", code="csrf")
    response = error_response(status, message)
    wait = getattr(exc, "wait", None)  # ninja's Throttled
    if wait:
        response["Retry-After"] = str(wait)
    return response


def _not_found(request: HttpRequest, exc: Any) -> HttpResponse:  # Http404
    return error_response(404, str(exc) or "not found")


def _too_large(request: HttpRequest, exc: Any) -> HttpResponse:  # RequestDataTooBig
    return error_response(413, "the body is larger than this server takes")


def _bad_value(request: HttpRequest, exc: Any) -> HttpResponse:  # DataError
    # PostgreSQL refusing a value the request carried: a NUL character in a name, a number or time
    # out of its range. The request's fault, so a 400, not a 500; logged, as it may be ours.
    logger.warning("%s %s: a value PostgreSQL refused: %s", request.method, request.path, exc)
    message = "a value is not one the database can store (a NUL character, a number or time out of range)"
    return error_response(400, message, code="bad_value")


def install_error_handlers(api: NinjaAPI) -> None:
    """Answer django-ninja's own errors in the API's shape."""
    api.add_exception_handler(DataError, _bad_value)
    api.add_exception_handler(ValidationError, _validation_error)
    api.add_exception_handler(HttpError, _http_error)
    api.add_exception_handler(Http404, _not_found)
    api.add_exception_handler(RequestDataTooBig, _too_large)
