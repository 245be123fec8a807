"""The canonical request id every source reduces its id to, and the facts that cannot be stored."""

from datetime import UTC, datetime

import pytest

from collectors.errors import RejectReason
from collectors.records import RequestFacts, canonical_engine_request_id, canonical_request_id, problem
from tests.support.captures import load_json

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("found", "canonical"),
    [
        ("cmpl-b24fab5563902569", "b24fab5563902569"),  # vLLM's own, made up when no header came
        ("chatcmpl-h2-0002", "h2-0002"),  # a chat answer for X-Request-Id: h2-0002
        ("cmpl-req-fixture-0001", "req-fixture-0001"),  # the capture's answer for its header
        ("ho-0000", "ho-0000"),  # the client's own id, as a REST sender reports it
        ("cmpl-cmpl-x", "cmpl-x"),  # a client id that begins like vLLM's: one prefix is vLLM's
        ("cmpl-", "cmpl-"),  # nothing after the prefix: not vLLM's
    ],
)
def test_answer_ids_lose_vllms_endpoint_prefix_once(found: str, canonical: str) -> None:
    assert canonical_request_id(found) == canonical


@pytest.mark.parametrize(
    ("engine_id", "canonical"),
    [
        ("cmpl-b24fab5563902569-0", "b24fab5563902569"),  # a completion's only prompt
        ("cmpl-h2-0002-0", "h2-0002"),  # the client's id ends in digits: only the prompt index goes
        ("chatcmpl-h2-0002", "h2-0002"),  # a chat's engine request is the answer's id itself
        ("chatcmpl-h2-0002-1", "h2-0002-1"),  # a chat has no prompt index: its digits are the id's
        ("cmpl-batch-7-1", "batch-7#1"),  # prompt 1 of a call that sent several
    ],
)
def test_engine_request_ids_name_the_request_they_served(engine_id: str, canonical: str) -> None:
    assert canonical_engine_request_id(engine_id) == canonical


def test_every_captured_span_names_the_answer_it_belongs_to() -> None:
    answer = load_json("completion-with-request-id.json")["response"]["id"]  # cmpl-req-fixture-0001
    assert canonical_engine_request_id(answer + "-0") == canonical_request_id(answer) == "req-fixture-0001"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"prompt_tokens": 191, "cached_tokens": 192}, "cached_tokens: more than prompt_tokens"),
        ({"model": "m" * 256}, "model: longer than 255 characters"),
        ({"tenant": "t" * 101}, "tenant: longer than 100 characters"),
        ({"request_id": "r" * 256}, "request_id: longer than 255 characters"),
        ({"tenant": "acme\x00"}, "tenant: contains a NUL character"),
        ({"template": "support\u00e9\x00"}, "template: contains a NUL character"),
        ({"model": "tiny\ud800"}, "model: not valid Unicode (a lone surrogate)"),
        ({"request_id": ""}, "request_id: empty"),
        ({"arrived_at": datetime(2026, 12, 1)}, "arrived_at: no time zone"),
    ],
)
def test_facts_the_database_cannot_take_name_the_field(fields: dict[str, object], reason: str) -> None:
    facts = RequestFacts(**{"request_id": "r1", "arrived_at": NOW, **fields})  # type: ignore[arg-type]
    found = problem(facts)
    assert found is not None and found.detail == reason
    assert found.code == CODES[reason.split(": ", 1)[1]]


CODES = {
    "more than prompt_tokens": RejectReason.CACHED_OVER_PROMPT,
    "longer than 255 characters": RejectReason.TEXT_TOO_LONG,
    "longer than 100 characters": RejectReason.TEXT_TOO_LONG,
    "contains a NUL character": RejectReason.TEXT_INVALID,
    "not valid Unicode (a lone surrogate)": RejectReason.TEXT_INVALID,
    "empty": RejectReason.FIELD_INVALID,
    "no time zone": RejectReason.NO_TIME_ZONE,
}


def test_facts_at_the_limits_are_fine() -> None:
    facts = RequestFacts(
        request_id="r" * 255, arrived_at=NOW, model="m\u00e9" * 127, prompt_tokens=191, cached_tokens=191
    )
    assert problem(facts) is None
