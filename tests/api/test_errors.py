"""Every error of the API is one JSON shape, {code, message, fields}, and the schema says so; the OTLP
receiver answers OTLP's google.rpc.Status. Each case of schemathesis' findings has its own test here."""

import json
from datetime import timedelta

import pytest
from django.test import Client, override_settings
from django.utils import timezone
from google.rpc.status_pb2 import Status

from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.prompts.models import DeployMarker, Template, TemplateVersion
from app.traffic.models import LossMinute
from tests.support.factories import a_server
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db
PROTOBUF = "application/x-protobuf"


@pytest.fixture
def user() -> Client:
    client = Client()
    client.force_login(fleet_viewer("engineer"))
    return client


@pytest.fixture
def token() -> str:
    return create_ingest_token(name="ci")


def shape(response: object) -> tuple[int, str]:
    answer = response.json()  # type: ignore[attr-defined]
    assert set(answer) == {"code", "message", "fields"} and answer["message"]
    return response.status_code, answer["code"]  # type: ignore[attr-defined]


def test_a_path_the_api_does_not_have_is_a_json_404(user: Client) -> None:
    assert shape(user.get("/api/v1/no-such-thing")) == (404, "not_found")


def test_a_method_an_operation_does_not_take_is_a_json_405_with_allow(user: Client) -> None:
    response = user.delete("/api/v1/servers")
    assert shape(response) == (405, "method_not_allowed")
    assert set(response["Allow"].split(", ")) == {"GET", "POST"}  # POST: the set-up API registers one


def test_no_session_and_no_token_is_a_json_401() -> None:
    assert shape(Client().get("/api/v1/servers")) == (401, "unauthorized")


def test_a_parameter_of_the_wrong_type_is_a_400_naming_it(user: Client) -> None:
    response = user.get("/api/v1/regressions?state=sideways")
    assert shape(response) == (400, "invalid")
    assert list(response.json()["fields"]) == ["state"]


def test_a_body_that_is_not_json_is_a_400_and_a_form_a_415(token: str) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    broken = Client().post("/api/v1/deploys", "{", content_type="application/json", headers=auth)
    assert shape(broken) == (400, "bad_body")
    form = Client().post("/api/v1/deploys", "template=a&version=b", content_type="text/plain", headers=auth)
    assert shape(form) == (415, "unsupported_media_type")


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_a_body_over_the_limit_is_a_json_413(token: str) -> None:
    body = json.dumps({"template": "t" * 200, "version": "abcdef0"})
    response = Client().post(
        "/api/v1/deploys", body, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )
    assert shape(response) == (413, "too_large")


def test_a_token_writes_without_a_csrf_token(token: str) -> None:
    """Found reading the authenticators' order: the session's CSRF check ran first and refused a
    script's token (Django's test client skips CSRF unless asked, so no test saw it)."""
    template = Template.objects.create(name="support-bot")
    TemplateVersion.objects.create(template=template, commit_sha="a" * 40, committed_at=timezone.now())
    script = Client(enforce_csrf_checks=True)
    body = json.dumps({"template": "support-bot", "version": "a" * 40})
    response = script.post(
        "/api/v1/deploys", body, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 201


def test_a_session_without_its_csrf_token_may_not_write() -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(fleet_viewer("admin", is_staff=True))
    response = browser.post("/api/v1/deploys", "{}", content_type="application/json")
    assert shape(response) == (403, "csrf")


@pytest.mark.parametrize(
    "query",
    [
        "until=1073-03-06T20:08:15.082525-22:15",  # PostgreSQL takes offsets up to 15:59: a 500
        "since=2000-01-01T00:00:00",  # no time zone: read as UTC
    ],
)
def test_any_offset_python_reads_is_taken_in_utc(user: Client, query: str) -> None:
    assert user.get(f"/api/v1/deploys?{query}").status_code == 200
    assert user.get(f"/api/v1/miss-causes?{query}").status_code == 200


def test_a_time_without_a_utc_equivalent_is_a_400(user: Client) -> None:
    assert shape(user.get("/api/v1/deploys?since=0001-01-01T00:00:00%2B05:00")) == (400, "invalid")


@pytest.mark.parametrize("query", ["offset=89191171475568582772656177152", "limit=10000000000000000000000"])
def test_an_offset_or_limit_past_what_postgresql_counts_is_a_400(user: Client, query: str) -> None:
    """schemathesis: an offset beyond bigint was a 500 (DataError) on every list."""
    assert shape(user.get(f"/api/v1/deploys?{query}")) == (400, "invalid")
    assert shape(user.get(f"/api/v1/regressions?{query}")) == (400, "invalid")


def test_an_unknown_id_in_a_paginated_path_is_a_documented_404(user: Client) -> None:
    """schemathesis: GET /templates/0/versions answered a 404 its schema did not list."""
    assert shape(user.get("/api/v1/templates/0/versions")) == (404, "not_found")
    schema = user.get("/api/openapi.json").json()
    assert "404" in schema["paths"]["/api/v1/templates/{template}/versions"]["get"]["responses"]


def test_the_schema_documents_the_error_shape_on_every_operation(client: Client) -> None:
    schema = client.get("/api/openapi.json").json()
    assert schema["components"]["schemas"]["ApiError"]["required"] == ["code", "message"]
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if path != "/v1/traces":
                assert "503" in operation["responses"], (method, path)
            if operation.get("security") and path != "/v1/traces":
                error = operation["responses"]["401"]["content"]["application/json"]["schema"]
                assert error == {"$ref": "#/components/schemas/ApiError"}, (method, path)


def test_the_ingest_400_is_documented_as_a_tally_or_an_error(client: Client) -> None:
    """schemathesis: the 400 of POST /requests was documented as an error only (ints and strings
    as status keys: the schema's second "400" overwrote django-ninja's), and a tally violated it."""
    schema = client.get("/api/openapi.json").json()
    documented = schema["paths"]["/api/v1/requests"]["post"]["responses"]["400"]
    assert "IngestAnswer" in json.dumps(documented)


def test_the_otlp_receiver_is_in_the_schema_with_its_content_types(client: Client) -> None:
    operation = client.get("/api/openapi.json").json()["paths"]["/v1/traces"]["post"]
    assert set(operation["requestBody"]["content"]) == {"application/x-protobuf", "application/json"}
    assert {"200", "400", "401", "413", "415", "429", "503"} <= set(operation["responses"])


@pytest.mark.parametrize("body", [b"null", b"[]", b'{"resourceSpans": 5}', b'"text"'])
def test_otlp_json_of_another_shape_is_a_400_with_a_status(token: str, body: bytes) -> None:
    """schemathesis: a JSON body of `null` was a 500 (TypeError in the decoder)."""
    response = Client().post(
        "/v1/traces", body, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 400
    assert response.json()["code"] == 3 and "not an OTLP trace export" in response.json()["message"]


def test_otlp_errors_are_protobuf_for_protobuf_and_other_types_are_a_415(token: str) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    refused = Client().post("/v1/traces", b"\x0a\xff\xff", content_type=PROTOBUF, headers=auth)
    assert refused.status_code == 400 and Status.FromString(refused.content).code == 3
    assert Client().post("/v1/traces", b"x", content_type="text/plain", headers=auth).status_code == 415
    unknown = Client().post("/v1/traces", b"", content_type=PROTOBUF)
    assert unknown.status_code == 401 and Status.FromString(unknown.content).code == 16
    wrong_method = Client().get("/v1/traces")
    assert (wrong_method.status_code, wrong_method["Allow"]) == (405, "POST")


def test_the_docs_page_is_served_from_installed_assets(client: Client) -> None:
    page = client.get("/api/docs").content.decode()
    assert "https://" not in page and "http://" not in page.replace("http://testserver", "")
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert f"/static/ninja/{asset}" in page


def test_servers_deploys_and_loss_reads(user: Client) -> None:
    now = timezone.now()
    server = Server.objects.create(name="vllm-0", base_url="http://u:p@vllm-0:8000", model="m", block_size=16)
    a_server(name="vllm-1", model="other", state="down")
    template = Template.objects.create(name="support-bot")
    version = TemplateVersion.objects.create(template=template, commit_sha="b" * 40, committed_at=now)
    DeployMarker.objects.create(template_version=version, server=server, deployed_at=now - timedelta(hours=2))
    DeployMarker.objects.create(template_version=version, deployed_at=now - timedelta(hours=1))

    servers = user.get("/api/v1/servers?model=m").json()
    assert (servers["count"], servers["items"][0]["name"]) == (1, "vllm-0")
    assert servers["items"][0]["base_url"] == "http://vllm-0:8000"
    assert user.get("/api/v1/servers?state=down").json()["items"][0]["name"] == "vllm-1"
    assert user.get("/api/v1/servers/vllm-1").json()["state"] == "down"
    assert shape(user.get("/api/v1/servers/nope")) == (404, "not_found")

    deploys = user.get("/api/v1/deploys?server=vllm-0&limit=1").json()
    assert deploys["count"] == 2 and deploys["items"][0]["server"] is None  # the fleet-wide one, latest
    since = (now - timedelta(minutes=90)).isoformat().replace("+", "%2B")
    assert user.get(f"/api/v1/deploys?since={since}").json()["count"] == 1


def test_miss_causes_for_a_scope_from_the_rollups(user: Client) -> None:
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    servers = [a_server(name=f"vllm-{i}") for i in range(2)]
    template = Template.objects.create(name="support-bot")
    LossMinute.objects.create(
        server=servers[0],
        template=template,
        tenant="acme",
        minute=minute,
        requests=3,
        diagnosed=3,
        evicted_tokens=64,
        prompt_changed_tokens=32,
    )
    LossMinute.objects.create(server=servers[1], minute=minute, requests=1, diagnosed=1, evicted_tokens=16)

    def lost(query: str) -> dict[str, int]:
        found = user.get(f"/api/v1/miss-causes?{query}").json()
        return {cause: tokens for cause, tokens in found.items() if tokens}

    assert lost("") == {"evicted": 80, "prompt_changed": 32}
    assert lost("scope=server&id=vllm-1") == {"evicted": 16}
    assert lost("scope=template&id=support-bot") == {"evicted": 64, "prompt_changed": 32}
    assert lost("scope=tenant&id=acme") == {"evicted": 64, "prompt_changed": 32}
    assert shape(user.get("/api/v1/miss-causes?scope=server&id=nope")) == (404, "not_found")


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/servers?model=%00",
        "/api/v1/servers/a%00b",
        "/api/v1/deploys?template=%00",
        "/api/v1/killers?template=%00",
    ],
)
def test_a_nul_character_in_a_parameter_is_a_400(user: Client, url: str) -> None:
    """schemathesis: `model=%00` was a 500 (PostgreSQL's DataError: text cannot hold NUL)."""
    assert shape(user.get(url)) == (400, "bad_value")


def test_a_nul_character_in_a_body_is_a_400(token: str) -> None:
    body = json.dumps({"template": "a\u0000b", "version": "abcdef0"})
    response = Client().post(
        "/api/v1/deploys", body, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )
    assert shape(response) == (400, "bad_value")
