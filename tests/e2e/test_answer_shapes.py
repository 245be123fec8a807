"""The simulator's answers against real vLLM's: the same requests, answers of the same shape and bytes.

For /v1/completions and /v1/chat/completions, whole and streamed, with and without
``return_token_ids``, ``stream_options.include_usage`` and ``continuous_usage_stats``, both servers
get the same requests in the same order. Each answer is compared as
- its status and Content-Type;
- its events: a stream is ``data: <json>\\n\\n`` events ending with ``data: [DONE]``, chunk for chunk;
- each JSON's layout: compact, text as UTF-8 (what pydantic and Starlette write), since the gateway
  edits these bytes;
- each JSON's skeleton: keys in order, nested, with the type of every value (null, str or "" for an
  empty one, int, list of n ints, ...), and the values of the keys in ``SAME_VALUES``.
Values that differ legitimately are left out: ids, creation seconds, generated text and token ids
(the simulator's tokens are random), the fingerprint string.

The real server is the session's (``real_vllm``), which test_real_vllm.py needs cold: every request
here carries a cache salt of this run's own, so no other request can hit the blocks it leaves. On each
side the first request is the prompt's first sight, so the cached tokens compare too.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.captures import load_json
from tests.support.otlp_receiver import OTLPReceiver
from tests.support.running_gateway import call
from tests.support.simulated_vllm import serve_simulated
from tests.support.vllm_cpu import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

PROMPT = load_json("completion-salt-a-1.json")["request"]["prompt"]
MESSAGES = [{"role": "system", "content": PROMPT[:400]}, {"role": "user", "content": "What does red mean?"}]
USAGE = {"include_usage": True}
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
VARIANTS: dict[str, dict[str, Any]] = {
    "whole": {},
    "whole-ids": {"return_token_ids": True},
    "stream": {"stream": True},
    "stream-ids": {"stream": True, "return_token_ids": True},
    "stream-usage": {"stream": True, "stream_options": USAGE},
    "stream-usage-ids": {"stream": True, "stream_options": USAGE, "return_token_ids": True},
    "stream-continuous": {"stream": True, "stream_options": CONTINUOUS},
    "stream-continuous-ids": {"stream": True, "stream_options": CONTINUOUS, "return_token_ids": True},
}
ENDPOINTS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
# 509 prompt tokens leave 3 of max_model_len (512): vLLM cuts max_tokens to them instead of refusing.
NEAR_THE_CONTEXT = (load_json("completion-salt-a-1.json")["response"]["choices"][0]["prompt_token_ids"] * 3)[
    :509
]
REFUSED: dict[str, tuple[str, dict[str, Any], int]] = {
    "completion-unknown-model": ("completion", {"model": "nope"}, 404),
    "chat-unknown-model": ("chat", {"model": "nope"}, 404),
    "completion-empty-salt": ("completion", {"cache_salt": ""}, 400),
    "completion-no-tokens": ("completion", {"max_tokens": 0}, 400),
    "chat-more-tokens-than-the-context": ("chat", {"max_tokens": 600}, 400),
    "completion-prompt-over-the-context": ("completion", {"prompt": PROMPT * 8}, 400),
    "chat-no-messages": ("chat", {"messages": []}, 400),
    "completion-cut-to-the-context": ("completion", {"prompt": NEAR_THE_CONTEXT, "max_tokens": 10}, 200),
}
# case -> (endpoint, what the case changes in the base request, the status vLLM answers)
CASES = {
    **{
        f"{endpoint}-{name}": (endpoint, fields, 200)
        for endpoint in ENDPOINTS
        for name, fields in VARIANTS.items()
    },
    **REFUSED,
}
# Values that must agree too: the same tokenizer, template, cache rules and max_tokens on both sides.
SAME_VALUES = frozenset(
    {
        "object",
        "model",
        "index",
        "role",
        "finish_reason",
        "stop_reason",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "cached_tokens",
        "created_cache_tokens",
        "type",
        "param",
        "code",
    }
)
DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    content_type: str
    body: bytes


def request_body(case: str, salt: str) -> tuple[str, dict[str, Any]]:
    """The path and body of a case; greedy, so the real tiny model's answers are the same every run."""
    endpoint, fields, _status = CASES[case]
    prompt: dict[str, Any] = {"prompt": PROMPT} if endpoint == "completion" else {"messages": MESSAGES}
    body = {"model": "tiny", **prompt, "max_tokens": 3, "temperature": 0, "cache_salt": salt}
    return ENDPOINTS[endpoint], {**body, **fields}


def send_all(base_url: str, salt: str) -> dict[str, Answer]:
    answers = {}
    for case in CASES:
        path, body = request_body(case, salt)
        answer = call("POST", base_url + path, body, {"Content-Type": "application/json"})
        answers[case] = Answer(answer.status, dict(answer.headers).get("Content-Type", ""), answer.body)
    return answers


@pytest.fixture(scope="module")
def answers(real_vllm: VLLMServer, otlp_receiver: OTLPReceiver) -> Iterator[dict[str, dict[str, Answer]]]:
    """Every case's answer from the real server and from a fresh simulated one, in the same order.

    vLLM merges the tokens its engine made while its API server was busy into one chunk, so a loaded
    machine can frame a real stream in fewer events: that is timing, and the whole sequence is sent
    again under a new salt (up to three times) until both sides' streams have as many events."""
    for _attempt in range(3):
        salt = f"answer-shapes-{uuid.uuid4().hex}"
        real = send_all(real_vllm.base_url, salt)
        with serve_simulated(otlp_endpoint=otlp_receiver.url) as simulated:
            simulator = send_all(simulated.base_url, salt)
        if all(real[case].body.count(DONE[:6]) == simulator[case].body.count(DONE[:6]) for case in CASES):
            break
    yield {"real": real, "simulator": simulator}


def payloads(answer: Answer, stream: bool) -> list[bytes]:
    """The JSON texts of an answer: the body, or each event's data; asserts the stream's framing."""
    if not stream:
        return [answer.body]
    assert answer.body.endswith(DONE), "a stream ends with data: [DONE]"
    events = answer.body.removesuffix(DONE).split(b"\n\n")
    assert events.pop() == b"", "every event ends with a blank line"
    assert all(event.startswith(b"data: {") for event in events), "each event is one data: line"
    return [event.removeprefix(b"data: ") for event in events]


def skeleton(value: Any, key: str = "") -> Any:
    """What of a JSON value must match: structure and types, and the values of SAME_VALUES keys."""
    if isinstance(value, dict):
        return [(k, skeleton(v, k)) for k, v in value.items()]
    if key in SAME_VALUES:
        return value
    if isinstance(value, list) and value and all(type(item) is int for item in value):
        return f"{len(value)} ints"
    if isinstance(value, list):
        return [skeleton(item) for item in value]
    if isinstance(value, str):
        return "str" if value else '""'
    return type(value).__name__


def compact(text: bytes) -> bytes:
    return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize("case", list(CASES))
def test_the_simulator_answers_in_vllms_shape(answers: dict[str, dict[str, Answer]], case: str) -> None:
    real, simulated = answers["real"][case], answers["simulator"][case]
    assert real.status == CASES[case][2]
    assert (simulated.status, simulated.content_type) == (real.status, real.content_type)
    stream = bool(request_body(case, "")[1].get("stream")) and real.status == 200
    real_texts, simulated_texts = payloads(real, stream), payloads(simulated, stream)
    for side, texts in (("real", real_texts), ("simulator", simulated_texts)):
        assert [compact(text) for text in texts] == texts, f"{side}: not compact UTF-8 JSON"
    real_shapes = [skeleton(json.loads(text)) for text in real_texts]
    simulated_shapes = [skeleton(json.loads(text)) for text in simulated_texts]
    pairs = zip(real_shapes, simulated_shapes, strict=False)
    first = next((i for i, (r, s) in enumerate(pairs) if r != s), None)
    assert first is None, f"JSON {first}: real {real_shapes[first]}, simulator {simulated_shapes[first]}"
    assert len(simulated_shapes) == len(real_shapes)
