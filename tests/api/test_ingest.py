"""REST bulk ingest of request records, with the real captures as the records."""

import json
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from app.api.ingest import admission
from app.api.models import IngestToken
from app.api.services import create_ingest_token
from app.domain.blockhash import block_hash_chain, signed_to_wire
from app.fleet.models import Server
from app.traffic.models import RejectedInput, RequestRecord
from collectors.parts import digest_key, part_digests
from collectors.records import canonical_request_id
from simulator.part_changes import anthropic_body, part_change_steps
from tests.support.captures import load_json
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db
URL = "/api/v1/requests"
CAPTURES = [
    "completion-shared-prefix-the",
    "completion-salt-a-1",
    "completion-salt-a-2",
    "completion-evict-0",
]


@pytest.fixture
def token() -> str:
    return create_ingest_token(name="test-source")


@pytest.fixture
def server() -> Server:
    return Server.objects.create(name="vllm-cpu", base_url="http://127.0.0.1:18000", block_size=32)


def record(name: str, **fields: object) -> dict[str, object]:
    """A request record as an application would report one of the captured completions."""
    capture = load_json(f"{name}.json")
    body = {
        "server": "vllm-cpu",
        "request_id": capture["response"]["id"],
        "arrived_at": timezone.now().isoformat(),
        "model": capture["request"]["model"],
        "usage": capture["response"]["usage"],
        "prompt_token_ids": capture["response"]["choices"][0]["prompt_token_ids"],
        "template": "support",
        "tenant": "acme",
    }
    if "cache_salt" in capture["request"]:
        body["cache_salt"] = capture["request"]["cache_salt"]
    return {**body, **fields}


def post(
    client: Client,
    token: str,
    payload: object,
    content_type: str = "application/json",
    *,
    compact: bool = False,
) -> tuple[int, dict[str, Any]]:
    """`compact`: JSON without spaces, as most encoders write it (the endpoint parses its token ids
    with numpy); else with them (msgspec reads them)."""
    separators = (",", ":") if compact else None
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=separators)
    response = client.post(URL, data, content_type=content_type, headers={"Authorization": f"Bearer {token}"})
    return response.status_code, response.json()


def test_without_a_live_token_nothing_is_ingested(client: Client, token: str, server: Server) -> None:
    assert client.post(URL, "[]", content_type="application/json").status_code == 401
    assert post(client, "psi_wrong", [record(CAPTURES[0])])[0] == 401
    IngestToken.objects.update(revoked=True)
    assert post(client, token, [record(CAPTURES[0])])[0] == 401
    assert not RequestRecord.objects.exists()


def test_captured_requests_are_stored_with_their_hash_chain(
    client: Client, token: str, server: Server
) -> None:
    status, answer = post(client, token, [record(name) for name in CAPTURES])

    assert (status, answer) == (200, {"stored": 4, "rejected": []})
    for name in CAPTURES:
        capture = load_json(f"{name}.json")
        stored = RequestRecord.objects.get(request_id=canonical_request_id(capture["response"]["id"]))
        assert stored.cached_tokens == capture["response"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert stored.prompt_tokens == capture["response"]["usage"]["prompt_tokens"]
        salt = capture["request"].get("cache_salt")
        chain = block_hash_chain(stored.token_ids or [], 32, cache_salt=salt)
        assert [signed_to_wire(h) for h in stored.block_hashes] == [h.wire for h in chain]
        assert bool(stored.salt_hash) == bool(salt) and salt not in stored.salt_hash if salt else True
        assert (stored.source, stored.template.name, stored.tenant) == ("rest", "support", "acme")


@pytest.mark.parametrize(
    "token_ids",
    [[], [0, 2**31 - 1, *range(100)], [-(2**31), *range(100)], "null"],
    ids=["none", "the column's range", "negative", "null"],
)
def test_token_ids_sent_compact_or_spaced_are_stored_alike(
    client: Client, token: str, server: Server, token_ids: object
) -> None:
    """Compact token ids are parsed by numpy; spaced ones, a sign or a null read by msgspec."""
    for compact in (True, False):
        ids = token_ids if token_ids != "null" else None
        records = [record(name, request_id=f"{compact}-{name}") for name in CAPTURES]
        records += [record(CAPTURES[0], request_id=f"{compact}-x", prompt_token_ids=ids)]
        assert post(client, token, records, compact=compact) == (200, {"stored": 5, "rejected": []})
    columns = ("token_ids", "block_hashes", "neutral_hashes", "family_id", "template_id", "cached_tokens")
    stored = {r["request_id"]: r for r in RequestRecord.objects.values("request_id", *columns)}
    for name in [*CAPTURES, "x"]:
        fast, strict = stored[f"True-{name}"], stored[f"False-{name}"]
        assert {k: v for k, v in fast.items() if k != "request_id"} == {
            k: v for k, v in strict.items() if k != "request_id"
        }
    assert stored["True-x"]["token_ids"] == (None if token_ids == "null" else token_ids)


def test_redelivery_and_a_second_source_merge_into_one_record(
    client: Client, token: str, server: Server
) -> None:
    first = record(CAPTURES[0])
    post(client, token, [first])
    post(client, token, [first])
    later = {k: first[k] for k in ("server", "request_id", "arrived_at")} | {"server_ttft_seconds": 0.0129}
    assert post(client, token, [later])[0] == 200

    stored = RequestRecord.objects.get()
    assert (stored.cached_tokens, stored.server_ttft_seconds) == (160, 0.0129)
    assert stored.token_ids and stored.block_hashes  # not erased by the record that lacked them


def test_json_lines_keep_the_good_records_and_name_the_bad_field(
    client: Client, token: str, server: Server
) -> None:
    lines = [
        record(CAPTURES[0]),
        record(CAPTURES[1], prompt_tokens="many"),
        record(CAPTURES[2], arrived_at="yesterday"),
    ]
    status, answer = post(
        client, token, "\n".join(json.dumps(line) for line in lines) + "\n", "application/x-ndjson"
    )

    assert status == 400
    assert answer["stored"] == 1
    assert [(r["index"], r["error"].split(":")[0]) for r in answer["rejected"]] == [
        (1, "prompt_tokens"),
        (2, "arrived_at"),
    ]
    assert RequestRecord.objects.count() == 1


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        pytest.param({"tenant": "acme\u0000"}, "tenant: contains a NUL character", id="nul"),
        pytest.param({"model": "tiny\ud800"}, "model: not valid Unicode (a lone surrogate)", id="surrogate"),
        pytest.param(
            {"cached_tokens": 500, "prompt_tokens": 191},
            "cached_tokens: more than prompt_tokens",
            id="cached",
        ),
        pytest.param(
            {"usage": {"prompt_tokens": 191, "prompt_tokens_details": {"cached_tokens": 425}}},
            "cached_tokens: more than prompt_tokens",
            id="cached-in-usage",
        ),
    ],
)
def test_a_record_the_database_cannot_take_is_rejected_alone_and_counted(
    client: Client, token: str, server: Server, fields: dict[str, object], reason: str
) -> None:
    bad = json.dumps(record(CAPTURES[1], **fields))  # NUL and the surrogate sent as \\u escapes
    body = f"[{json.dumps(record(CAPTURES[0]))}, {bad}, {json.dumps(record(CAPTURES[2]))}]"

    status, answer = post(client, token, body)

    assert (status, answer) == (400, {"stored": 2, "rejected": [{"index": 1, "error": reason}]})
    assert RejectedInput.objects.get(server=server, source="rest").detail == reason
    assert RequestRecord.objects.count() == 2


def test_a_json_line_that_is_not_json_is_rejected_alone(client: Client, token: str, server: Server) -> None:
    lines = [
        json.dumps(record(CAPTURES[0])),
        '{"server": "vllm-cpu", "request',
        json.dumps(record(CAPTURES[1])),
    ]
    status, answer = post(client, token, "\n".join(lines), "application/x-ndjson")
    assert (status, answer) == (
        400,
        {"stored": 2, "rejected": [{"index": 1, "error": "record: not JSON (or not UTF-8)"}]},
    )


@pytest.mark.parametrize("compact", [False, True])
def test_duplicates_within_one_batch_merge_as_across_batches(
    client: Client, token: str, server: Server, compact: bool
) -> None:
    first = record(CAPTURES[0], arrived_at=timezone.now().isoformat(), server_ttft_seconds=0.0129)
    again = {"server": "vllm-cpu", "request_id": first["request_id"], "client_ttft_seconds": 0.0187,
             "arrived_at": (timezone.now() + timedelta(seconds=1)).isoformat(),
             "prompt_token_ids": []}  # fmt: skip
    assert post(client, token, [first, again], compact=compact) == (200, {"stored": 2, "rejected": []})
    stored = RequestRecord.objects.get()  # one row, as when the two came in two batches
    assert (stored.server_ttft_seconds, stored.client_ttft_seconds, stored.cached_tokens) == (
        0.0129,
        0.0187,
        160,
    )
    assert stored.arrived_at == datetime.fromisoformat(first["arrived_at"])  # type: ignore[arg-type]
    assert stored.token_ids == first["prompt_token_ids"] and stored.block_hashes  # not erased by []


def test_records_of_different_requests_never_merge_whatever_their_times(
    client: Client, token: str, server: Server
) -> None:
    now = timezone.now().isoformat()
    body = [
        record(CAPTURES[0], request_id="h2-0002", arrived_at=now),
        record(CAPTURES[1], request_id="h2-0003", arrived_at=now),
    ]
    assert post(client, token, body)[0] == 200
    assert sorted(RequestRecord.objects.values_list("request_id", flat=True)) == ["h2-0002", "h2-0003"]


def test_the_clients_id_and_vllms_answer_id_name_one_request(
    client: Client, token: str, server: Server
) -> None:
    # An application that sent X-Request-Id: ho-0000 reports its id; the gateway (or a second
    # application span) reports vLLM's answer id, cmpl-ho-0000. One request, one row.
    now = timezone.now()
    mine = record(CAPTURES[0], request_id="ho-0000", arrived_at=now.isoformat(), usage=None)
    vllms = record(
        CAPTURES[0], request_id="cmpl-ho-0000", arrived_at=(now + timedelta(seconds=2)).isoformat()
    )
    assert post(client, token, [mine])[0] == 200
    assert post(client, token, [vllms])[0] == 200
    stored = RequestRecord.objects.get()
    assert (stored.request_id, stored.cached_tokens) == ("ho-0000", 160)


def test_records_past_retention_or_too_far_ahead_are_rejected_counted_and_not_fatal(
    client: Client, token: str, server: Server
) -> None:
    old = record(CAPTURES[0], arrived_at=(timezone.now() - timedelta(days=31)).isoformat())
    ahead = record(CAPTURES[2], arrived_at=(timezone.now() + timedelta(days=30)).isoformat())
    status, answer = post(client, token, [old, record(CAPTURES[1]), ahead])
    assert status == 400 and answer["stored"] == 1
    assert answer["rejected"] == [
        {"index": 0, "error": "arrived_at: older than the request records' retention (30 days)"},
        {"index": 2, "error": "arrived_at: further ahead than the request records' partitions"},
    ]
    counted = RejectedInput.objects.filter(server=server, source="rest").values_list(
        "reason", "detail", "count"
    )
    assert sorted(counted) == [
        ("too_far_ahead", "arrived_at: further ahead than the request records' partitions", 1),
        ("too_old", "arrived_at: older than the request records' retention (30 days)", 1),
    ]


def test_history_inside_its_retention_is_stored_in_a_partition_made_for_it(
    client: Client, token: str, server: Server
) -> None:
    # A fresh install has partitions from yesterday on; a capture 42 hours old (and one 29 days old)
    # is inside the 30 days of retention and is stored.
    arrivals = [timezone.now() - timedelta(hours=42), timezone.now() - timedelta(days=29)]
    body = [record(name, arrived_at=at.isoformat()) for name, at in zip(CAPTURES, arrivals, strict=False)]

    status, answer = post(client, token, body)

    assert (status, answer) == (200, {"stored": 2, "rejected": []})
    stored = RequestRecord.objects.order_by("arrived_at").values_list("arrived_at", flat=True)
    assert list(stored) == sorted(arrivals)
    assert post(client, token, body) == (200, {"stored": 2, "rejected": []})  # redelivered: merged
    assert RequestRecord.objects.count() == 2


def test_an_unknown_server_is_kept_as_a_proposal(client: Client, token: str) -> None:
    status, _ = post(client, token, [record(CAPTURES[0], server="http://10.1.2.3:8000")])
    assert status == 200
    proposed = Server.objects.get()
    assert (proposed.name, proposed.state, proposed.base_url) == (
        "101238000",
        "proposed",
        "http://10.1.2.3:8000",
    )


def test_anthropic_usage_maps_to_the_same_fields(client: Client, token: str, server: Server) -> None:
    usage = {
        "input_tokens": 31,
        "cache_read_input_tokens": 160,
        "cache_creation_input_tokens": 0,
        "output_tokens": 4,
    }
    post(client, token, [record(CAPTURES[0], usage=usage, prompt_token_ids=None)])
    stored = RequestRecord.objects.get()
    assert (stored.prompt_tokens, stored.cached_tokens, stored.completion_tokens) == (191, 160, 4)


def test_the_ttl_of_a_cache_write_is_stored_from_the_usage_or_the_field(
    client: Client, token: str, server: Server
) -> None:
    hour = {"input_tokens": 31, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 160,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 160}}  # fmt: skip
    records = [
        record(CAPTURES[0], usage=hour, prompt_token_ids=None, provider="anthropic"),
        record(
            CAPTURES[1],
            usage=None,
            prompt_token_ids=None,
            provider="anthropic",
            prompt_tokens=500,
            cached_tokens=0,
            cache_write_tokens=100,
            cache_ttl="5m",
        ),
        record(CAPTURES[2], prompt_token_ids=None, provider="anthropic", cache_ttl="a while"),
    ]
    status, answer = post(client, token, records)
    assert status == 400  # a record refused
    assert [(r["index"], r["error"].split(":")[0]) for r in answer["rejected"]] == [(2, "cache_ttl")]
    stored = dict(RequestRecord.objects.values_list("cache_write_tokens", "cache_ttl_seconds"))
    assert stored == {160: 3600, 100: 300}


def test_hash_only_mode_keeps_hashes_and_no_token_ids(client: Client, token: str, server: Server) -> None:
    with override_settings(PREFIXSCOPE_HASH_ONLY=True):
        post(client, token, [record(CAPTURES[0])])
    stored = RequestRecord.objects.get()
    assert stored.token_ids is None and len(stored.block_hashes) == 6


def test_the_openapi_schema_documents_the_endpoint(client: Client) -> None:
    schema = client.get("/api/openapi.json").json()
    operation = schema["paths"][URL]["post"]
    assert "application/x-ndjson" in operation["requestBody"]["content"]
    record_schema = operation["requestBody"]["content"]["application/json"]["schema"]["items"]
    assert record_schema["required"] == ["server", "request_id", "arrived_at"]
    assert set(record_schema["properties"]) >= {
        "usage",
        "prompt_token_ids",
        "cache_salt",
        "client_ttft_seconds",
        "server_ttft_seconds",
    }
    assert "X-Request-Id" in record_schema["properties"]["request_id"]["description"]
    assert set(operation["responses"]) == {"200", "400", "401", "413", "429", "503"}
    assert "Retry-After" in operation["description"]
    assert client.get("/api/docs").status_code == 200


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"server": None}, "server"),
        ({"request_id": ""}, "request_id"),
        ({"cached_tokens": -1}, "cached_tokens"),
        ({"prompt_tokens": 2**31}, "prompt_tokens"),  # more than the column holds
        ({"prompt_token_ids": [1, "x"]}, "prompt_token_ids[1]"),
        ({"prompt_token_ids": [1, 2**31]}, "prompt_token_ids[1]"),  # more than the column holds
        ({"prompt_token_ids": [1, 2**64]}, "prompt_token_ids[1]"),  # more than int64 too
        ({"prompt_token_ids": [1, 2.5]}, "prompt_token_ids[1]"),
        ({"prompt_token_ids": 7}, "prompt_token_ids"),
        ({"usage": {"prompt_tokens": "many"}}, "usage.prompt_tokens"),
    ],
)
@pytest.mark.parametrize("compact", [False, True])
def test_a_bad_record_in_an_array_is_rejected_by_field_and_the_others_stored(
    client: Client, token: str, server: Server, change: dict[str, object], field: str, compact: bool
) -> None:
    bad = {k: v for k, v in record(CAPTURES[1], **change).items() if v is not None}
    status, answer = post(client, token, [record(CAPTURES[0]), bad, 7], compact=compact)

    assert (status, answer["stored"]) == (400, 1)
    assert [(r["index"], r["error"].split(":")[0]) for r in answer["rejected"]] == [(1, field), (2, "record")]
    assert RequestRecord.objects.count() == 1


def test_a_body_over_the_limit_is_a_413_and_nothing_is_stored(
    client: Client, token: str, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "MAX_BODY_BYTES", 1000)  # the captures' token ids make the batch larger
    status, answer = post(client, token, [record(name) for name in CAPTURES])
    assert status == 413 and "smaller batches" in answer["message"]
    assert not RequestRecord.objects.exists()


def test_an_arrival_time_without_a_time_zone_is_refused(client: Client, token: str, server: Server) -> None:
    naive = timezone.now().replace(tzinfo=None).isoformat()
    status, answer = post(client, token, [record(CAPTURES[0], arrived_at=naive)])
    assert status == 400 and answer["rejected"][0]["error"].startswith("arrived_at:")


def test_bad_records_are_counted_per_server_and_reason_in_metrics_and_on_the_collection_page(
    client: Client, token: str, server: Server
) -> None:
    bad_tokens = record(CAPTURES[0], prompt_token_ids=[1, "x"])
    bad_count = record(CAPTURES[1], cached_tokens=-1, server="http://127.0.0.1:18000")  # by base URL
    unknown = record(CAPTURES[2], cached_tokens=-1, server="vllm-nobody-registered")
    status, _ = post(client, token, [bad_tokens, bad_count, unknown, record(CAPTURES[3]), 7])
    assert status == 400

    values = {
        (s.labels["server"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(client.get("/metrics").content.decode())
        for s in family.samples
        if s.name == "prefixscope_rejected_inputs_total" and s.labels["source"] == "rest"
    }
    assert values == {  # a code per fault, never the message: prompt_token_ids[] and cached_tokens are one
        ("vllm-cpu", "field_invalid"): 2.0,
        ("", "field_invalid"): 2.0,  # a server nobody registered is not proposed from a bad record; 7
    }
    assert not Server.objects.filter(name="vllm-nobody-registered").exists()
    client.force_login(fleet_viewer("engineer"))
    html = client.get("/collection/").content.decode()
    row = html[html.index("vllm-cpu") : html.index("</tr>", html.index("vllm-cpu"))]
    assert '<td class="num bad">2</td>' in row
    refused = html[html.index("Refused input") :]
    assert "<code>field_invalid</code>" in refused  # the code, and the latest message beside it
    assert "cached_tokens: Expected `int` &gt;= 0" in refused


def test_a_request_body_is_kept_as_its_parts_digests_and_a_malformed_one_rejected_alone(
    client: Client, token: str, server: Server
) -> None:
    (first, second) = part_change_steps(per_phase=1, model="tiny", adapter="", phases=("base", "system"))
    reason = "request_body.messages: expected a list of objects with a role"
    batch = [
        record(CAPTURES[0], request_body=first.body),
        record(CAPTURES[1], request_body={"messages": "Where is my parcel?"}),
        record(CAPTURES[2], request_body=anthropic_body(second.body)),
    ]
    status, answer = post(client, token, batch)

    assert (status, answer) == (400, {"stored": 2, "rejected": [{"index": 1, "error": reason}]})
    counted = RejectedInput.objects.filter(server=server, source="rest").values_list(
        "reason", "detail", "count"
    )
    assert list(counted) == [("parts_invalid", reason, 1)]
    key = digest_key(settings.SECRET_KEY)
    stored = dict(RequestRecord.objects.values_list("request_id", "part_digests"))
    assert stored[canonical_request_id(str(batch[0]["request_id"]))] == msgspec.to_builtins(
        part_digests(first.body, key=key)
    )
    changed = stored[canonical_request_id(str(batch[2]["request_id"]))]
    assert changed["system"] != stored[canonical_request_id(str(batch[0]["request_id"]))]["system"]
    assert "parcel" not in json.dumps(stored).lower()  # the digests, never the text
