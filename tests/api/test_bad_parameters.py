"""One status for a bad parameter: every operation of /api/openapi.json, given a value its schema
refuses (a word for a number, a value outside an enum, a body of the wrong type, a NUL character
for free text), answers 400 in the API's error shape, and its schema documents a 400 and no 422."""

import json
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.test import Client

from app.api.api import api
from app.api.services import create_ingest_token

pytestmark = pytest.mark.django_db
SCHEMA = api.get_openapi_schema()
# The OTLP receiver answers OTLP's own google.rpc.Status (tests/api/test_errors.py).
OTHER_SHAPES = {("post", "/v1/traces")}
OPERATIONS = [
    (method, path, operation)
    for path, item in SCHEMA["paths"].items()
    for method, operation in item.items()
    if (method, path) not in OTHER_SHAPES and (operation.get("parameters") or operation.get("requestBody"))
]


def refused_value(schema: dict[str, Any]) -> str | None:
    """A value the parameter's schema refuses, None for free text."""
    if "$ref" in schema:
        return refused_value(SCHEMA["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]])
    for choice in schema.get("anyOf", ()):
        found = refused_value(choice)
        if found is not None:
            return found
    if "enum" in schema:
        return "sideways"
    if schema.get("type") == "integer":
        return "many"
    if schema.get("type") == "boolean":
        return "perhaps"
    if schema.get("format") == "date-time":
        return "yesterday"
    return None


def bad_request(method: str, path: str, operation: dict[str, Any]) -> tuple[str, str | None]:
    """The URL (and JSON body) of a call with one bad parameter: a typed one given a value of another
    type; else, with a JSON body, a body of the wrong type; else free text with a NUL character."""
    parameters = operation.get("parameters", [])
    values = {p["name"]: "1" for p in parameters if p["in"] == "path"}
    query = ""
    typed = [(p, refused_value(p["schema"])) for p in parameters]
    bad = next(((p, v) for p, v in typed if v is not None), None)
    body_types = operation.get("requestBody", {}).get("content", {})
    body = None
    if bad is None and "application/json" in body_types:
        body = "[[]]"
    elif bad is None:
        bad = (parameters[0], "a\x00b")
    if bad is not None:
        parameter, value = bad
        if parameter["in"] == "path":
            values[parameter["name"]] = value
        else:
            query = f"?{parameter['name']}={quote(value)}"
    url = path.format(**{name: quote(value, safe="") for name, value in values.items()}) + query
    if body is None and "application/json" in body_types:
        body = "{}"
    return url, body


@pytest.fixture
def caller() -> Client:
    """A staff user's session with an ingest token too, so that every operation's auth passes."""
    client = Client(headers={"Authorization": f"Bearer {create_ingest_token(name='ci')}"})
    client.force_login(User.objects.create_superuser("admin"))
    return client


@pytest.mark.parametrize(
    ("method", "path", "operation"), OPERATIONS, ids=[f"{m.upper()} {p}" for m, p, _ in OPERATIONS]
)
def test_a_bad_parameter_is_a_400_in_the_error_shape(
    caller: Client, method: str, path: str, operation: dict[str, Any]
) -> None:
    url, body = bad_request(method, path, operation)
    send = getattr(caller, method)
    response = send(url, body, content_type="application/json") if body is not None else send(url)
    assert response.status_code == 400, (url, body, response.content[:300])
    answer = response.json()
    if (method, path) == ("post", "/api/v1/requests"):  # a batch: the rejected records, each with why
        assert answer["stored"] == 0 and answer["rejected"][0]["error"], answer
        return
    assert set(answer) == {"code", "message", "fields"} and answer["code"] and answer["message"], answer
    assert "400" in json.dumps(list(operation["responses"])) or 400 in operation["responses"]
    assert 422 not in operation["responses"] and "422" not in operation["responses"]
