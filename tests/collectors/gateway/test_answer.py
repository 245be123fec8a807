"""Answers with what the gateway added taken out, and the facts read from them, on the real captures.

vLLM 0.32 writes JSON compactly (``json.dumps(..., separators=(",", ":"), ensure_ascii=False)`` for
whole answers, pydantic's compact JSON for chunks): re-encoding a capture that way gives its bytes.
"""

import json
from typing import Any

import pytest

from collectors.gateway.answer import StreamEditor, read_answer, strip_token_ids
from collectors.gateway.plan import Plan
from tests.support.captures import VLLM_CPU_FIXTURES, load_json

CAPTURED_STREAM = (VLLM_CPU_FIXTURES / "completion-stream.sse.txt").read_bytes()
FINGERPRINT = "vllm-0.32.0-b8471d29"  # the captured stream's usage chunk carries it


def vllm_json(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def sse(*payloads: Any) -> bytes:
    return b"".join(b"data: " + vllm_json(p) + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


def without_ids(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer as vLLM writes it when nobody asked for token ids: the keys stay, their values are null."""
    answer = json.loads(json.dumps(answer))
    for choice in answer.get("choices", []):
        for key in ("prompt_token_ids", "token_ids"):
            if key in choice:
                choice[key] = None
    if "prompt_token_ids" in answer:
        answer["prompt_token_ids"] = None
    return answer


def plan(*, ids: bool = False, usage: bool = False, chat: bool = False) -> Plan:
    return Plan(body=b"{}", chat=chat, added_token_ids=ids, added_usage=usage)


def captured_chunks() -> list[dict[str, Any]]:
    events = CAPTURED_STREAM.decode().split("\n\n")
    return [json.loads(e.removeprefix("data: ")) for e in events if e.startswith("data: {")]


@pytest.mark.parametrize("name", ["completion-salt-a-2", "completion-report-full", "completion-evict-3"])
def test_token_ids_become_null_in_a_captured_answer_and_nothing_else_changes(name: str) -> None:
    answer = load_json(f"{name}.json")["response"]
    assert strip_token_ids(vllm_json(answer)) == vllm_json(without_ids(answer))


def test_token_ids_become_null_in_spaced_json_too() -> None:
    answer = load_json("completion-salt-a-2.json")["response"]
    assert strip_token_ids(json.dumps(answer).encode()) == json.dumps(without_ids(answer)).encode()


def test_token_ids_written_inside_a_text_are_text() -> None:
    answer = {"choices": [{"text": 'say {"token_ids":[1,2]} and ,"prompt_token_ids": [3]', "token_ids": [5]}]}
    assert strip_token_ids(vllm_json(answer)) == vllm_json(
        {"choices": [{"text": answer["choices"][0]["text"], "token_ids": None}]}
    )


def test_the_captured_stream_comes_out_as_vllm_sends_it_to_a_client_that_asked_for_nothing() -> None:
    *content, usage_chunk = captured_chunks()
    assert usage_chunk["choices"] == [] and usage_chunk["system_fingerprint"] == FINGERPRINT
    expected = [without_ids(chunk) for chunk in content]
    expected[-1]["system_fingerprint"] = FINGERPRINT  # vLLM stamps the terminal chunk when no usage follows
    editor = StreamEditor(plan(ids=True, usage=True))
    assert editor.feed(CAPTURED_STREAM) + editor.close() == sse(*expected)


def test_a_stream_arriving_byte_by_byte_comes_out_the_same() -> None:
    whole = StreamEditor(plan(ids=True, usage=True))
    expected = whole.feed(CAPTURED_STREAM) + whole.close()
    editor = StreamEditor(plan(ids=True, usage=True))
    out = b"".join(editor.feed(CAPTURED_STREAM[i : i + 1]) for i in range(len(CAPTURED_STREAM)))
    assert out + editor.close() == expected


def test_the_captured_streams_facts_are_read_whatever_was_edited() -> None:
    for edits in [plan(), plan(ids=True, usage=True)]:
        editor = StreamEditor(edits)
        editor.feed(CAPTURED_STREAM)
        editor.close()
        facts = editor.facts
        assert facts.request_id == "cmpl-a922d79d7861b8c9" and facts.model == "tiny"
        assert facts.usage is not None and facts.usage["prompt_tokens_details"] == {"cached_tokens": 160}
        assert facts.token_ids is not None and len(facts.token_ids) == 191
        assert facts.content_seen and not facts.error and not facts.malformed


def test_a_stream_nothing_was_added_to_passes_chunk_for_chunk() -> None:
    editor = StreamEditor(plan())
    chunks = [CAPTURED_STREAM[:100], CAPTURED_STREAM[100:2000], CAPTURED_STREAM[2000:]]
    assert [editor.feed(chunk) for chunk in chunks] == chunks
    assert editor.close() == b""


def test_events_after_a_terminal_chunk_wait_with_it_for_the_usage_chunk() -> None:
    chunk = {"id": "c", "choices": [{"index": 0, "text": "a", "finish_reason": None}]}
    terminal = {"id": "c", "choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]}
    other = {"id": "c", "choices": [{"index": 1, "text": "c", "finish_reason": None}]}
    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 3}, "system_fingerprint": "fp"}
    editor = StreamEditor(plan(usage=True))
    assert editor.feed(sse(chunk)[:-14]) == sse(chunk)[:-14]
    assert editor.feed(b"data: " + vllm_json(terminal) + b"\n\n") == b""
    assert editor.feed(b"data: " + vllm_json(other) + b"\n\n") == b""
    stamped = {**terminal, "system_fingerprint": "fp"}
    assert editor.feed(b"data: " + vllm_json(usage) + b"\n\ndata: [DONE]\n\n") == sse(stamped, other)
    assert editor.facts.usage == {"prompt_tokens": 3}


def test_usage_the_server_sends_by_itself_stays() -> None:
    # --enable-force-include-usage: usage in every chunk, and a usage chunk the client gets anyway.
    chunk = {"id": "c", "choices": [{"text": "a", "finish_reason": "stop"}], "usage": {"prompt_tokens": 3}}
    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 3}, "system_fingerprint": "fp"}
    editor = StreamEditor(plan(usage=True))
    assert editor.feed(sse(chunk, usage)) + editor.close() == sse(chunk, usage)


def test_a_chat_stream_loses_its_prompt_token_ids_and_the_chunks_sent_only_for_token_ids() -> None:
    role = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "prompt_token_ids": [1, 2, 3]}  # fmt: skip
    quiet = {"id": "c", "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None,
                                     "token_ids": [9]}]}  # fmt: skip
    content = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [4]}]}
    editor = StreamEditor(plan(ids=True, chat=True))
    out = editor.feed(sse(role, quiet, content)) + editor.close()
    assert out == sse({**role, "prompt_token_ids": None}, without_ids(content))
    assert editor.facts.token_ids == [1, 2, 3] and editor.facts.content_seen


def test_a_role_chunk_is_not_content() -> None:
    editor = StreamEditor(plan())
    editor.feed(sse({"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
    assert not editor.facts.content_seen


def test_an_error_in_the_middle_of_a_stream_passes_and_marks_the_answer() -> None:
    error = {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}
    terminal = {"id": "c", "choices": [{"index": 0, "text": "b", "finish_reason": "stop", "token_ids": [1]}]}
    editor = StreamEditor(plan(ids=True, usage=True))
    out = editor.feed(sse(terminal, error)) + editor.close()
    assert out == sse(without_ids(terminal), error)
    assert editor.facts.error


def test_an_unreadable_event_passes_and_is_reported() -> None:
    editor = StreamEditor(plan(ids=True))
    assert editor.feed(b"data: {broken\n\n: a comment\n\n") == b"data: {broken\n\n: a comment\n\n"
    assert editor.facts.malformed == "answer: not JSON"


def test_the_facts_of_a_captured_answer() -> None:
    answer = load_json("completion-salt-a-2.json")["response"]
    facts = read_answer(vllm_json(answer))
    assert (facts.request_id, facts.model, facts.usage) == (answer["id"], "tiny", answer["usage"])
    assert facts.token_ids == answer["choices"][0]["prompt_token_ids"]


def test_a_batch_of_prompts_has_no_one_prompt() -> None:
    answer = {"id": "c", "choices": [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]}
    facts = read_answer(vllm_json(answer))
    assert facts.token_ids is None and facts.prompts == {0: [1, 2], 1: [3]}
    # n = 2: vLLM numbers prompt p's choices p * 2 and p * 2 + 1.
    choices = [{"index": i, "prompt_token_ids": ids} for i, ids in enumerate([[1, 2], [1, 2], [3], [3]])]
    assert read_answer(vllm_json({"id": "c", "choices": choices}), samples=2).prompts == {0: [1, 2], 1: [3]}
    one = {
        "id": "c",
        "choices": [{"index": 0, "prompt_token_ids": [1, 2]}, {"index": 1, "prompt_token_ids": [1, 2]}],
    }
    assert read_answer(vllm_json(one), samples=2).token_ids == [1, 2]


@pytest.mark.parametrize("body", [b"", b"[1]", b"<html>"])
def test_an_answer_that_is_not_a_json_object_is_malformed(body: bytes) -> None:
    assert read_answer(body).malformed


def test_an_error_answer_is_an_error() -> None:
    error = {"object": "error", "message": "model not found", "type": "NotFoundError", "code": 404}
    assert read_answer(vllm_json(error)).error
