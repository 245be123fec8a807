"""Gzip bodies (`Content-Encoding: gzip`) on both ingest endpoints: read, inflated no further than the
body limit, and refused whole when they are not valid gzip."""

import gzip
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client, RequestFactory
from django.utils import timezone
from google.rpc.status_pb2 import Status

from app.api.ingest import admission
from app.api.ingest.admission import BodyTooLarge, read_body
from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.traffic.models import RequestRecord
from tests.api.test_otlp import captured_export

MIB = 1024 * 1024
GIB = 1024 * MIB
ENDPOINTS = {"rest": "/api/v1/requests", "otlp": "/v1/traces"}


@pytest.fixture
def token() -> str:
    Server.objects.create(name="vllm-cpu", base_url="http://127.0.0.1:18000", block_size=32)
    return create_ingest_token(name="vllm-cpu")


def batch(endpoint: str) -> tuple[bytes, str]:
    """A body each endpoint stores (REST: two records; OTLP: vLLM's captured export) and its type."""
    if endpoint == "otlp":
        return captured_export().SerializeToString(), "application/x-protobuf"
    now = timezone.now().isoformat()
    records = [
        {"server": "vllm-cpu", "request_id": f"gz-{n}", "arrived_at": now, "prompt_tokens": 40}
        for n in range(2)
    ]
    return json.dumps(records).encode(), "application/json"


def post(client: Client, token: str, endpoint: str, body: bytes, content_type: str, encoding: str) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Content-Encoding": encoding}
    return client.post(ENDPOINTS[endpoint], body, content_type=content_type, headers=headers)


def gzip_bomb(inflated: int) -> bytes:
    """A gzip body about a thousandth the size of the `inflated` zero bytes it holds: members of
    16 MiB one after another (a valid gzip file, made without holding the whole in memory)."""
    member = gzip.compress(bytes(16 * MIB), compresslevel=9)
    return member * (inflated // (16 * MIB))


def peak_memory(call: Callable[[], Any]) -> tuple[Any, int]:
    """What `call` returns, and the most memory Python held for it at once (bytes)."""
    tracemalloc.start()
    try:
        return call(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_gzip_bomb_is_refused_413_without_being_inflated(client: Client, token: str, endpoint: str) -> None:
    bomb = gzip_bomb(GIB)  # the 1 MB body of the issue that inflates to 1 GiB
    assert len(bomb) < 1.1 * MIB
    _, content_type = batch(endpoint)
    # Unmeasured, a first request: a process's first request imports the views (scipy among them),
    # which is no memory the body costs.
    post(client, token, endpoint, bomb, content_type, "gzip")

    response, peak = peak_memory(lambda: post(client, token, endpoint, bomb, content_type, "gzip"))

    assert response.status_code == 413
    # Inflated to the limit (32 MiB) and no further: about twice that at most, as zlib joins its output.
    assert peak < 3 * admission.MAX_BODY_BYTES
    assert not RequestRecord.objects.exists()


def test_a_gzip_member_over_the_limit_is_inflated_no_further(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "MAX_BODY_BYTES", MIB)
    bomb = gzip.compress(bytes(64 * MIB), compresslevel=9)  # one gzip member, 64 times the limit
    request = RequestFactory().post(
        "/v1/traces", bomb, content_type="application/x-protobuf", headers={"Content-Encoding": "gzip"}
    )

    def read() -> BaseException | None:
        try:
            read_body(request)
        except BodyTooLarge as exc:
            return exc
        return None

    refused, peak = peak_memory(read)

    assert isinstance(refused, BodyTooLarge)
    assert "once decompressed" in str(refused)
    assert peak < 3 * MIB


def test_a_body_that_fills_the_limit_exactly_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "MAX_BODY_BYTES", MIB)
    body = bytes(range(256)) * (MIB // 256)
    two_members = gzip.compress(body[:1000]) + gzip.compress(body[1000:])
    request = RequestFactory().post(
        "/api/v1/requests", two_members, content_type="application/json", headers={"Content-Encoding": "gzip"}
    )
    assert read_body(request) == body


@pytest.mark.django_db
@pytest.mark.parametrize("content_type", ["application/json", "application/x-ndjson"])
def test_a_gzip_rest_batch_is_stored(client: Client, token: str, content_type: str) -> None:
    body, _ = batch("rest")
    if content_type == "application/x-ndjson":
        body = b"\n".join(json.dumps(r).encode() for r in json.loads(body))

    response = post(client, token, "rest", gzip.compress(body), content_type, "gzip")

    assert (response.status_code, response.json()) == (200, {"stored": 2, "rejected": []})
    assert set(RequestRecord.objects.values_list("request_id", flat=True)) == {"gz-0", "gz-1"}


def corrupt_checksum(body: bytes) -> bytes:
    packed = gzip.compress(body)
    return packed[:-8] + bytes(b ^ 0xFF for b in packed[-8:-4]) + packed[-4:]  # CRC-32 of the trailer


def corrupt_data(body: bytes) -> bytes:
    packed = bytearray(gzip.compress(body))
    packed[20:40] = b"\xff" * 20
    return bytes(packed)


NOT_GZIP: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "sent as is": (lambda body: body, "gzip"),
    "cut short": (lambda body: gzip.compress(body)[:-10], "gzip"),
    "corrupt data": (corrupt_data, "gzip"),
    "wrong checksum": (corrupt_checksum, "gzip"),
    "trailing garbage": (lambda body: gzip.compress(body) + b"garbage", "gzip"),
    "an encoding not read": (lambda body: body, "br"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("case", NOT_GZIP)
def test_a_body_not_valid_in_its_encoding_is_a_400_and_nothing_is_stored(
    client: Client, token: str, endpoint: str, case: str
) -> None:
    encode, encoding = NOT_GZIP[case]
    body, content_type = batch(endpoint)

    response = post(client, token, endpoint, encode(body), content_type, encoding)

    assert response.status_code == 400
    # REST: the API's error document; OTLP: a google.rpc.Status, protobuf as the request was
    rest = endpoint == "rest"
    message = response.json()["message"] if rest else Status.FromString(response.content).message
    assert ("gzip" in message) if encoding == "gzip" else ("'br'" in message)
    assert not RequestRecord.objects.exists()
