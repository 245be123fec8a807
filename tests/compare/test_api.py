"""POST /api/v1/compare and GET /api/v1/compare/{slug}: the divergence as JSON, for logged-in users."""

import json
from typing import Any

import pytest
from django.test import Client

from tests.compare.conftest import Record, capture, prompt_ids
from tests.support.captures import stored_block_hashes

pytestmark = pytest.mark.django_db


def _post(client: Client, body: dict[str, Any]) -> Any:
    return client.post("/api/v1/compare", json.dumps(body), content_type="application/json")


def _request(key: Any) -> dict[str, str]:
    return {"server": "vllm-cpu", "request_id": key.request_id, "arrived_at": key.arrived_at.isoformat()}


def test_two_recorded_requests_give_the_divergence_and_a_permalink(record: Record, signed_in: Client) -> None:
    a, b = record("timestamp-top-1", offset=1), record("timestamp-top-2", offset=2)

    response = _post(signed_in, {"a": {"request": _request(a)}, "b": {"request": _request(b)}})

    assert response.status_code == 200, response.content
    answer = response.json()
    assert (answer["precision"], answer["reusable_tokens"], answer["first_divergence"]) == ("token", 0, 7)
    assert answer["wasted_prefill_tokens"] == 192 and answer["block_size"] == 32
    assert answer["edits"] == [
        {"kind": "replaced", "a_start": 7, "a_end": 8, "b_start": 7, "b_end": 8},
        {"kind": "replaced", "a_start": 12, "a_end": 16, "b_start": 12, "b_end": 15},
    ]
    assert answer["a"]["compatibility"]["template"] == "support-bot"
    assert answer["permalink"] == f"http://testserver/compare/{answer['slug']}/"
    assert answer["estimate"]["basis"].startswith("configured")
    again = signed_in.get(f"/api/v1/compare/{answer['slug']}")
    assert again.status_code == 200 and again.json() == answer
    with_blocks = signed_in.get(f"/api/v1/compare/{answer['slug']}?include_blocks=true").json()
    assert [block["status"] for block in with_blocks["blocks"]["b"]] == ["diverged"] * 6 + ["partial_tail"]


def test_different_salts_are_named_and_the_blocks_carry_the_hashes_vllm_published(
    record: Record, signed_in: Client
) -> None:
    a, b = record("salt-a-1", offset=1), record("salt-b-1", offset=2)

    answer = _post(
        signed_in, {"a": {"request": _request(a)}, "b": {"request": _request(b)}, "include_blocks": True}
    ).json()

    assert answer["blocked_by"] == ["tenant_salt"] and answer["reusable_tokens"] == 0
    assert answer["identical"] is True and answer["first_divergence"] is None
    stored = stored_block_hashes()
    a_hashes = [block["wire_hash"] for block in answer["blocks"]["a"] if block["status"] != "partial_tail"]
    assert len(a_hashes) == 5 and set(a_hashes) <= stored  # the salted blocks vLLM stored for tenant-a
    assert {block["status"] for block in answer["blocks"]["b"]} == {"diverged", "partial_tail"}


@pytest.mark.parametrize(
    ("earlier", "later", "picked"),
    [
        # shared-prefix-I shares its 5 system-text blocks with both; the latest request, whose
        # time line changes block 0, shares none.
        (
            [("shared-prefix-the", {}), ("with-request-id", {}), ("timestamp-top-1", {})],
            "shared-prefix-I",
            "with-request-id-2",
        ),
        # A repeat of shared-prefix-the shares all 6 of its blocks with it, 5 with shared-prefix-I.
        ([("shared-prefix-the", {}), ("shared-prefix-I", {})], "shared-prefix-the", "shared-prefix-the-1"),
        # Nothing shares a block: the latest under the same model (not the LoRA adapter's).
        (
            [("shared-prefix-the", {}), ("timestamp-top-1", {}), ("timestamp-top-1", {"model": "tiny-lora"})],
            "timestamp-top-2",
            "timestamp-top-1-2",
        ),
    ],
    ids=["most blocks, latest of equals", "all blocks", "none shared"],
)
def test_previous_is_the_earlier_request_sharing_the_most_blocks_with_b(
    record: Record, signed_in: Client, earlier: list[tuple[str, dict[str, Any]]], later: str, picked: str
) -> None:
    for offset, (name, fields) in enumerate(earlier, start=1):
        record(name, offset=offset, **fields)
    b = record(later, offset=len(earlier) + 1)

    answer = _post(signed_in, {"a": {"previous": True}, "b": {"request": _request(b)}}).json()

    reported = capture(later)["response"]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert answer["a"]["label"].startswith(f"request {picked} on vllm-cpu,")
    assert (answer["reusable_tokens"], answer["blocked_by"]) == (reported, [])


def test_the_estimate_uses_the_servers_measured_ttft_slope(record: Record, signed_in: Client) -> None:
    # 24 captured requests of the last hour, each 1 ms plus 0.1 ms per uncached prompt token.
    for offset in range(-24, 0):
        name = ("salt-a-1", "salt-a-2", "evict-0")[offset % 3]
        usage = capture(name)["response"]["usage"]
        uncached = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
        record(name, offset=offset, client_ttft_seconds=0.001 + uncached * 1e-4)
    a = record("timestamp-top-1", offset=-30, client_ttft_seconds=None)
    b = record("timestamp-top-2", offset=-29, client_ttft_seconds=None)

    answer = _post(signed_in, {"a": {"request": _request(a)}, "b": {"request": _request(b)}}).json()

    assert answer["estimate"]["seconds_per_token"] == pytest.approx(1e-4)
    assert answer["estimate"]["basis"].startswith("measured on vllm-cpu")
    assert answer["estimate"]["ttft_seconds"] == pytest.approx(192 * 1e-4)  # the wasted prefill


def test_token_ids_and_text_compare_without_a_server_and_say_so(signed_in: Client) -> None:
    text = capture("salt-a-1")["request"]["prompt"]

    answer = _post(
        signed_in, {"a": {"token_ids": prompt_ids("salt-a-1")}, "b": {"text": text + " And one more."}}
    ).json()

    assert answer["first_divergence"] == 191 and answer["block_size"] == 16
    assert answer["a"]["tokenizer_used"] == "token ids as given"
    assert answer["b"]["tokenizer_used"] == "bundled GPT-2 (offline)"
    assert answer["b"]["warning"].startswith("No server or model was chosen")
    assert text not in json.dumps(answer) and "support" not in json.dumps(answer)  # no prompt text


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"a": {"text": "x", "token_ids": [1]}, "b": {"text": "y"}}, 400),
        ({"a": {"text": "x"}, "b": {"previous": True}}, 400),
        ({"a": {"previous": True}, "b": {"text": "y"}}, 400),
        ({"a": {"text": "x"}, "b": {"text": "y"}, "server": "nope"}, 400),
        ({"a": {"token_ids": [-1]}, "b": {"text": "y"}}, 400),
        ({"a": {"text": "x"}, "b": {"text": "y"}, "block_size": 0}, 400),
    ],
)
def test_bad_requests_are_refused_with_the_reason(
    signed_in: Client, body: dict[str, Any], status: int
) -> None:
    response = _post(signed_in, body)
    assert response.status_code == status, response.content


def test_the_api_needs_a_logged_in_user(client: Client) -> None:
    assert _post(client, {"a": {"text": "x"}, "b": {"text": "y"}}).status_code == 401
    assert client.get("/api/v1/compare/whatever").status_code == 401


def test_an_unknown_slug_is_a_404(signed_in: Client) -> None:
    assert signed_in.get("/api/v1/compare/nosuchone").status_code == 404


def test_the_openapi_schema_documents_both_operations(client: Client) -> None:
    schema = client.get("/api/openapi.json").json()

    post, get = schema["paths"]["/api/v1/compare"]["post"], schema["paths"]["/api/v1/compare/{slug}"]["get"]
    assert post["summary"] == "Compare two prompts" and get["summary"] == "A saved comparison"
    assert "CompareOut" in schema["components"]["schemas"]
    assert post["security"] == [{"PersonalTokenAuth": []}, {"PersonSession": []}]
