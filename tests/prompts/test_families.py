"""Prefix families: requests without template metadata, ingested through POST /api/v1/requests as an
application reports the captured completions, grouped by their leading blocks; named and bound to a
template through the API and the page; unbound, diagnosed against the earlier prompts without a
template (not their family's: a timestamp in the first blocks would make each prompt its own)."""

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.domain.blockhash import signed_block_hashes
from app.fleet.models import Server
from app.prompts.models import PrefixFamily, Template
from app.traffic.models import RequestDiagnosis, RequestRecord
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts, canonical_request_id
from tests.support.captures import load_json
from tests.support.sessions import session, wait_for_lock_waits
from tests.support.tokens import reader_bearer

pytestmark = pytest.mark.django_db
INGEST, FAMILIES = "/api/v1/requests", "/api/v1/families"
SUPPORT = [  # one support-policy system text (185 tokens) and different questions, unsalted
    "completion-shared-prefix-the",
    "completion-shared-prefix-I",
    "completion-with-request-id",
    "completion-report-full",
]
SALTED = ["completion-salt-a-1", "completion-salt-a-2", "completion-salt-b-1"]  # tenants a, a, b


@pytest.fixture
def server() -> Server:
    return Server.objects.create(
        name="vllm-cpu", base_url="http://127.0.0.1:18000", block_size=32, model="tiny"
    )


def tokens(name: str) -> list[int]:
    return list(load_json(f"{name}.json")["response"]["choices"][0]["prompt_token_ids"])


def record(name: str, **fields: object) -> dict[str, object]:
    """A captured completion as an application reports it, with no template metadata."""
    capture = load_json(f"{name}.json")
    body = {
        "server": "vllm-cpu",
        "request_id": capture["response"]["id"],
        "arrived_at": timezone.now().isoformat(),
        "model": capture["request"]["model"],
        "usage": capture["response"]["usage"],
        "prompt_token_ids": tokens(name),
        "tenant": capture["request"].get("cache_salt", "acme"),
    }
    if "cache_salt" in capture["request"]:
        body["cache_salt"] = capture["request"]["cache_salt"]
    return {**body, **fields}


def document(request_id: str, **fields: object) -> dict[str, object]:
    """Another template's request: the first captured document with another ending from token 200."""
    prompt = tokens("completion-evict-0")[:200] + tokens("completion-evict-1")[200:]
    return record("completion-evict-0", request_id=request_id, prompt_token_ids=prompt, **fields)


def ingest(token: str, body: list[dict[str, object]]) -> None:
    response = Client().post(
        INGEST,
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200 and response.json()["stored"] == len(body), response.json()


def stored(name_or_id: str) -> RequestRecord:
    """The record of a captured completion (by its file's name) or of a request id."""
    request_id = name_or_id
    if name_or_id.startswith("completion-"):
        request_id = str(load_json(f"{name_or_id}.json")["response"]["id"])
    found: RequestRecord = RequestRecord.objects.get(request_id=canonical_request_id(request_id))
    return found


def family_of(name_or_id: str) -> PrefixFamily:
    return PrefixFamily.objects.get(pk=stored(name_or_id).family_id or 0)


def usage(prompt_tokens: int, cached_tokens: int) -> dict[str, object]:
    return {"prompt_tokens": prompt_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def test_two_templates_traffic_without_metadata_forms_two_families(token: str, server: Server) -> None:
    ingest(token, [record(name) for name in SUPPORT] + [record("completion-evict-0"), document("doc-2")])

    support, documents = PrefixFamily.objects.order_by("-requests")
    assert (support.requests, documents.requests) == (4, 2)
    assert (support.model, support.block_size, support.blocks, support.name, support.template) == (
        "tiny", 32, 4, "", None
    )  # fmt: skip
    for name in SUPPORT:
        assert (stored(name).family_id, stored(name).template_id) == (support.pk, None)
        assert stored(name).block_hashes[3] == support.key  # unsalted: its chain is the neutral one
    assert stored("completion-evict-0").family_id == stored("doc-2").family_id == documents.pk
    assert (support.sample_server, support.sample_request_id) == (server, stored(SUPPORT[0]).request_id)


def test_salted_tenants_of_one_prompt_land_in_one_family(token: str, server: Server) -> None:
    ingest(token, [record(name) for name in [*SALTED, SUPPORT[0]]])

    family = PrefixFamily.objects.get()
    records = [stored(name) for name in [*SALTED, SUPPORT[0]]]
    assert {r.family_id for r in records} == {family.pk} and family.requests == 4
    assert len({r.block_hashes[3] for r in records}) == 3  # tenant a, tenant b, unsalted: three chains
    assert [r.neutral_hashes[3] for r in records[:3]] == [family.key] * 3


@pytest.mark.parametrize(
    ("length", "blocks"),
    [(17, None), (31, None), (32, 1), (100, 3), (127, 3), (128, 4), (191, 4)],
)
def test_a_prompt_shorter_than_the_family_blocks_is_keyed_by_its_last_full_block(
    token: str, server: Server, length: int, blocks: int | None
) -> None:
    prompt = tokens(SUPPORT[0])[:length]
    other = [*prompt[:-1], prompt[-1] + 1]  # differs in its last token only
    ingest(
        token,
        [
            record(SUPPORT[0], prompt_token_ids=prompt, request_id="one", usage=usage(length, 0)),
            record(SUPPORT[1], prompt_token_ids=other, request_id="two", usage=usage(length, 0)),
        ],
    )

    one, two = stored("one"), stored("two")
    if blocks is None:  # no full block: no chain, no family
        assert (one.family_id, two.family_id, PrefixFamily.objects.count()) == (None, None, 0)
        return
    family = family_of("one")
    assert (family.blocks, family.key) == (blocks, one.block_hashes[blocks - 1])
    same = length % 32 != 0  # the tokens that differ are past the last full block
    assert (two.family_id == one.family_id) is same
    assert PrefixFamily.objects.count() == (1 if same else 2)


def test_redelivery_makes_no_second_family(token: str, server: Server) -> None:
    batch = [record(name) for name in SUPPORT[:2]] + [record("completion-evict-0")]
    ingest(token, batch)
    first = set(PrefixFamily.objects.values_list("pk", "model", "block_size", "key"))
    ingest(token, batch)
    ingest(token, [record(SUPPORT[2]), document("doc-2")])  # new requests of the same families

    assert set(PrefixFamily.objects.values_list("pk", "model", "block_size", "key")) == first
    assert RequestRecord.objects.count() == 5
    assert {r.family_id for r in RequestRecord.objects.all()} == {pk for pk, *_ in first}


def test_records_with_template_metadata_have_no_family_even_merged_with_one_that_had(
    token: str, server: Server
) -> None:
    ingest(token, [record(SUPPORT[0], template="support"), record(SUPPORT[1])])
    assert stored(SUPPORT[0]).family_id is None and stored(SUPPORT[0]).template_id == support().pk
    assert stored(SUPPORT[1]).family_id is not None

    later = {k: record(SUPPORT[1])[k] for k in ("server", "request_id")}  # a span naming its template
    ingest(token, [later | {"arrived_at": stored(SUPPORT[1]).arrived_at.isoformat(), "template": "support"}])
    merged = stored(SUPPORT[1])
    assert (merged.family_id, merged.template_id) == (None, support().pk)
    assert merged.block_hashes  # kept from the first source


def ingest_in_a_thread(items: list[RequestFacts]) -> int:
    try:
        return ingest_request_records(items, source="gateway", now=timezone.now()).stored
    finally:
        connection.close()  # the thread's own connection


@pytest.mark.django_db(transaction=True)
def test_batches_making_the_same_families_at_once_share_them(server: Server) -> None:
    prompts = {"support": tokens(SUPPORT[0]), "documents": tokens("completion-evict-0")}
    first, second = (
        [RequestFacts(request_id=f"{n}-{name}", arrived_at=timezone.now(), server="vllm-cpu", model="tiny",
                      prompt_token_ids=prompts[name]) for name in names]
        for n, names in enumerate([["support", "documents"], ["documents", "support"]])
    )  # fmt: skip
    key = signed_block_hashes(prompts["support"][:128], 32)[-1]
    with session() as other, ThreadPoolExecutor(2) as pool:
        # Another batch has made the support family and not committed: both batches wait for it.
        other.execute(
            "INSERT INTO prompts_prefixfamily (model, block_size, key, blocks, first_seen_at, last_seen_at, "
            "requests, sample_request_id, name) VALUES ('tiny', 32, %s, 4, now(), now(), 1, 'other', '')",
            [key],
        )
        outcomes = [pool.submit(ingest_in_a_thread, batch) for batch in (first, second)]
        wait_for_lock_waits(2, query="INSERT INTO prompts_prefixfamily")
        other.commit()
        assert [outcome.result() for outcome in outcomes] == [2, 2]

    support, documents = PrefixFamily.objects.order_by("-requests")
    assert (support.key, support.requests, support.sample_request_id, documents.requests) == (
        key,
        3,
        "other",
        2,
    )
    families = {r.request_id: r.family_id for r in RequestRecord.objects.all()}
    assert families == {
        f"{n}-{name}": f.pk for n in (0, 1) for name, f in [("support", support), ("documents", documents)]
    }


def support() -> Template:
    return Template.objects.get(name="support")


def patch(client: Client, family: PrefixFamily, body: dict[str, object], token: str) -> tuple[int, Any]:
    response = client.patch(
        f"{FAMILIES}/{family.pk}",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    return response.status_code, response.json()


def test_binding_a_family_gives_its_later_requests_the_template(token: str, server: Server) -> None:
    ingest(token, [record(name) for name in SUPPORT[:2]] + [record("completion-evict-0")])
    support = family_of(SUPPORT[0])
    template = Template.objects.create(name="support")

    status, answer = patch(Client(), support, {"name": "support desk", "template_id": template.pk}, token)
    assert status == 200, answer
    assert (answer["name"], answer["template_id"], answer["bound_at"] is not None) == (
        "support desk", template.pk, True
    )  # fmt: skip
    ingest(token, [record(name) for name in SUPPORT[2:]] + [document("doc-2")])

    assert [stored(name).template_id for name in SUPPORT] == [None, None, template.pk, template.pk]
    assert {stored(name).family_id for name in SUPPORT} == {support.pk}
    assert stored("doc-2").template_id is None  # another family, not bound

    status, answer = patch(Client(), support, {"template_id": None}, token)
    assert (status, answer["template_id"], answer["bound_at"], answer["name"]) == (
        200,
        None,
        None,
        "support desk",
    )
    assert patch(Client(), support, {"template_id": 10**9}, token)[0] == 404
    assert (
        Client().patch(f"{FAMILIES}/{support.pk}", "{}", content_type="application/json").status_code == 401
    )


def test_the_api_lists_families_most_requests_first(token: str, server: Server) -> None:
    ingest(token, [record(name) for name in SUPPORT[:3]] + [record("completion-evict-0")])
    response = Client().get(FAMILIES, headers=reader_bearer())

    assert response.status_code == 200
    answer = response.json()
    assert answer["count"] == 2 and [f["requests"] for f in answer["items"]] == [3, 1]
    top = answer["items"][0]
    assert (top["model"], top["block_size"], top["blocks"], top["template_id"]) == ("tiny", 32, 4, None)
    assert int(top["key"], 16) % 2**63 == PrefixFamily.objects.get(pk=top["id"]).key % 2**63
    assert top["sample"] == {"server": "vllm-cpu", "request_id": stored(SUPPORT[0]).request_id}


def test_the_page_lists_families_with_a_sample_request(engineer: Client, token: str, server: Server) -> None:
    ingest(token, [record(name) for name in SUPPORT[:2]] + [record("completion-evict-0")])
    html = engineer.get(reverse("prompts:families")).content.decode()

    sample = reverse("dashboard:request-detail", args=["vllm-cpu", stored(SUPPORT[0]).request_id])
    assert f'href="{sample}"' in html and "4 of 32 tokens (128)" in html
    assert html.index(stored(SUPPORT[0]).request_id) < html.index(stored("completion-evict-0").request_id)
    family = family_of(SUPPORT[0])
    page = engineer.get(reverse("prompts:family", args=[family.pk])).content.decode()
    assert "Name and bind" not in page  # staff only
    assert engineer.post(reverse("prompts:family", args=[family.pk]), {"name": "x"}).status_code == 403


def test_staff_name_and_bind_a_family_with_the_form(staff: Client, token: str, server: Server) -> None:
    ingest(token, [record(SUPPORT[0])])
    family = PrefixFamily.objects.get()
    template = Template.objects.create(name="support")
    url = reverse("prompts:family", args=[family.pk])
    assert "affects later requests only" in staff.get(url).content.decode()

    response = staff.post(url, {"name": "support desk", "template": template.pk}, follow=True)

    family.refresh_from_db()
    assert (family.name, family.template, family.bound_at is not None) == ("support desk", template, True)
    assert "requests from now on carry support" in response.content.decode()
    ingest(token, [record(SUPPORT[1])])
    assert (stored(SUPPORT[0]).template_id, stored(SUPPORT[1]).template_id) == (None, template.pk)


def test_a_prompt_without_a_template_is_compared_with_earlier_ones_and_cold_if_it_shares_nothing(
    token: str, server: Server
) -> None:
    start = timezone.now() - timedelta(minutes=5)

    def at(seconds: int) -> str:
        return (start + timedelta(seconds=seconds)).isoformat()

    ingest(
        token,
        [
            record("completion-evict-0", arrived_at=at(0), usage=usage(283, 0)),
            record(SUPPORT[0], arrived_at=at(10), usage=usage(192, 0)),  # another family: never seen, cold
            document("doc-2", arrived_at=at(20), usage=usage(283, 192)),  # its first six blocks reused
        ],
    )
    assert diagnose_requests(now=timezone.now()) == 3

    found = {d.request_id: d for d in RequestDiagnosis.objects.all()}
    causes = {r: (found[r].cause, found[r].diverged_at) for r in found}
    assert causes == {
        stored("completion-evict-0").request_id: ("cold", None),
        stored(SUPPORT[0]).request_id: ("cold", None),  # shares not a token: not "changed" at 0
        "doc-2": ("prompt_changed", 200),  # departs from the earlier document at token 200
    }
