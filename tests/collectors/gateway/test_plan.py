"""What the gateway adds to a completion request, and when it leaves the request alone."""

import json

import pytest

from collectors.gateway.plan import plan_request, trace_id_from
from tests.support.captures import load_json

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def encoded(body: dict[str, object]) -> bytes:
    return json.dumps(body).encode()


def test_a_plain_request_is_asked_for_token_ids_and_keeps_its_other_fields() -> None:
    request = {
        k: v for k, v in load_json("completion-salt-a-1.json")["request"].items() if k != "return_token_ids"
    }
    plan = plan_request(COMPLETIONS, encoded(request))
    assert plan is not None
    assert json.loads(plan.body) == {**request, "return_token_ids": True}
    assert (plan.added_token_ids, plan.added_usage, plan.chat) == (True, False, False)
    assert (plan.model, plan.cache_salt) == ("tiny", "tenant-a")


def test_a_stream_is_also_asked_for_its_usage_keeping_its_stream_options() -> None:
    body = {"model": "tiny", "messages": [], "stream": True, "stream_options": {"other": 1}}
    plan = plan_request(CHAT, encoded(body))
    assert plan is not None and plan.chat and plan.added_usage and plan.added_token_ids
    assert json.loads(plan.body)["stream_options"] == {"other": 1, "include_usage": True}


def test_a_request_that_asked_for_everything_goes_upstream_byte_for_byte() -> None:
    body = json.dumps(load_json("completion-stream.request.json"), indent=3).encode()
    plan = plan_request(COMPLETIONS, body)
    assert plan is not None and plan.body is body and not plan.edits_answer


@pytest.mark.parametrize(
    ("fields", "adds_ids", "adds_usage"),
    [
        ({"return_token_ids": False}, True, True),
        ({"echo": True}, False, True),  # vLLM would echo an empty prompt text
        ({"return_token_ids": "yes"}, False, True),  # vLLM's to refuse, not the gateway's to fix
        ({"stream_options": {"include_usage": False}}, True, True),
        ({"stream_options": {"continuous_usage_stats": True}}, True, False),  # usage in every chunk
        ({"stream_options": "all"}, True, False),
        ({"stream": False}, True, False),
        ({"stream": "true"}, True, False),
    ],
)
def test_what_is_added_depends_on_what_the_client_asked(
    fields: dict[str, object], adds_ids: bool, adds_usage: bool
) -> None:
    plan = plan_request(COMPLETIONS, encoded({"model": "tiny", "prompt": "hi", "stream": True, **fields}))
    assert plan is not None
    assert (plan.added_token_ids, plan.added_usage) == (adds_ids, adds_usage)


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b'"prompt"', b'{"model": "tiny",'])
def test_a_body_that_is_not_a_json_object_is_not_planned(body: bytes) -> None:
    assert plan_request(COMPLETIONS, body) is None


def test_an_empty_or_odd_salt_is_not_a_salt() -> None:
    for salt in ["", 7, None]:
        plan = plan_request(COMPLETIONS, encoded({"prompt": "hi", "cache_salt": salt}))
        assert plan is not None and plan.cache_salt is None and plan.model == ""


@pytest.mark.parametrize(
    ("header", "trace_id"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
        (" 00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-00 ", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""),
        ("00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01", ""),
        ("00-4bf92f35-00f067aa0ba902b7-01", ""),
        ("", ""),
    ],
)
def test_the_trace_id_comes_from_a_well_formed_traceparent(header: str, trace_id: str) -> None:
    assert trace_id_from(header) == trace_id
