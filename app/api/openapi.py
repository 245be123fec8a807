"""What the OpenAPI document says beyond what django-ninja writes from the operations: the errors
every operation can answer (in the API's one error shape), and the OTLP receiver at /v1/traces,
a plain Django view outside the API's router."""

from typing import Any

from ninja.openapi.schema import OpenAPISchema

from app.api.errors import ApiError

ERROR_REF = {"$ref": "#/components/schemas/ApiError"}
METHODS = ("get", "put", "post", "delete", "patch")


def completed(schema: OpenAPISchema) -> OpenAPISchema:
    """The schema with ApiError among its components, the common errors on every operation, and
    POST /v1/traces."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ApiError"] = ApiError.model_json_schema(ref_template="#/components/schemas/{model}")
    schemes = schema["components"].get("securitySchemes", {})
    cookies = {name for name, scheme in schemes.items() if scheme.get("in") == "cookie"}
    for item in schema["paths"].values():
        for method in METHODS:
            if method in item:
                _add_errors(item[method], cookies)
    schema["paths"]["/v1/traces"] = {"post": TRACES}
    return schema


def _add_errors(operation: dict[str, Any], cookies: set[str]) -> None:
    """The errors any operation of its kind may answer, where it does not document them itself;
    `cookies`: the security schemes that are a session (CSRF-checked)."""
    common = {503: "The database is unavailable: retry after Retry-After seconds"}
    security = {name for requirement in operation.get("security", ()) for name in requirement}
    if security:
        common[401] = "No live session or token"
    if security & cookies:
        common[403] = "Not allowed to that user, or the CSRF check failed"
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    reads_json = "$ref" in body  # a body django-ninja reads; an operation reading its own says its errors
    if operation.get("parameters") or reads_json:
        common[400] = (
            "A parameter or field is not valid (`fields` says which and why), or a value the database "
            "cannot store: a NUL character, a number or time out of range"
        )
    if reads_json:
        common[400] = "The body is not JSON, a field is not valid, or a value the database cannot store"
        common[413] = "The body is larger than the server takes"
        common[415] = "The body is not sent as application/json"
    if any(parameter.get("in") == "path" for parameter in operation.get("parameters", ())):
        common[404] = "Nothing has that id or name"
    responses = operation.setdefault("responses", {})
    for status, description in common.items():
        if status not in responses and str(status) not in responses:  # django-ninja's keys are ints
            responses[status] = _error(description)


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_REF}}}


def _otlp_error(description: str) -> dict[str, Any]:
    # OTLP/HTTP's errors are a google.rpc.Status in the request's encoding.
    return {
        "description": description,
        "content": {
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": RPC_STATUS},
        },
    }


RPC_STATUS = {
    "type": "object",
    "description": "google.rpc.Status, as OTLP/HTTP answers a JSON export's error",
    "properties": {
        "code": {
            "type": "integer",
            "description": "The gRPC status code: 3 invalid argument, 16 unauthenticated",
        },
        "message": {"type": "string"},
        "details": {"type": "array", "items": {"type": "object"}},
    },
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}}

TRACES: dict[str, Any] = {
    "operationId": "otlp_traces",
    "tags": ["ingest"],
    "summary": "OTLP/HTTP trace receiver",
    "description": (
        "OpenTelemetry traces (an ExportTraceServiceRequest) from vLLM's `--otlp-traces-endpoint` or an "
        "application's OTLP exporter, as protobuf or JSON, optionally `Content-Encoding: gzip`; "
        "`Authorization: Bearer <ingest token>`. A span names its server by its `prefixscope.server` "
        "attribute, else the token's name is taken. Rejected spans are counted in `partial_success`. "
        "At `/v1/traces`, outside `/api`."
    ),
    "security": [{"IngestTokenAuth": []}],
    "requestBody": {
        "required": True,
        "content": {
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "ExportTraceServiceRequest in OTLP's JSON encoding",
                    "properties": {"resourceSpans": {"type": "array", "items": {"type": "object"}}},
                }
            },
        },
    },
    "responses": {
        "200": {
            "description": "Stored: an ExportTraceServiceResponse in the request's encoding",
            "content": {
                "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "partialSuccess": {
                                "type": "object",
                                "properties": {
                                    "rejectedSpans": {"type": "string", "description": "int64, as text"},
                                    "errorMessage": {"type": "string"},
                                },
                            }
                        },
                    }
                },
            },
        },
        "400": _otlp_error("Not an export, or not valid gzip"),
        "401": _otlp_error("No live ingest token"),
        "405": _otlp_error("Not a POST"),
        "413": _otlp_error("Over 32 MiB, decompressed too"),
        "415": _otlp_error("Neither application/x-protobuf nor application/json"),
        "429": {
            "description": "Busy: nothing stored, send it again after Retry-After",
            "headers": RETRY_AFTER,
        },
        "503": {
            "description": "No database: nothing stored, send it again after Retry-After",
            "headers": RETRY_AFTER,
        },
    },
}
