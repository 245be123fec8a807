"""The gateway in front of the real vLLM CPU server: clients get byte for byte what vLLM sends directly.

The reference where the simulator could differ (test_answer_shapes.py compares the two). The
gateway asks vLLM for token ids and a stream's usage when the client did not, and must take them
out again: among others the chat stream's opening chunk, whose top-level `prompt_token_ids` it asked
for and must put back to null. A warm-up call caches each prompt first, so the call through the
gateway and the direct call meet the same cache; the tiny model at temperature 0 writes the same
tokens every time; ids and creation seconds are masked.

The real server is the session's (``real_vllm``), which test_real_vllm.py needs cold: every request
here carries a cache salt of this run's own, so no other request can hit the blocks it leaves.
"""

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.captures import load_json
from tests.support.running_gateway import Answer, KeptRecords, call, masked, running_gateway, wait_for
from tests.support.vllm_cpu import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
PROMPT = load_json("completion-salt-a-1.json")["request"]["prompt"]
MESSAGES = [{"role": "system", "content": PROMPT[:400]}, {"role": "user", "content": "What does red mean?"}]
SALT = f"gateway-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def recorder() -> KeptRecords:
    return KeptRecords()


@pytest.fixture(scope="module")
def gateway(real_vllm: VLLMServer, recorder: KeptRecords) -> Iterator[str]:
    with running_gateway(real_vllm.base_url, recorder) as url:
        yield url


def completion(**fields: Any) -> dict[str, Any]:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "cache_salt": SALT}
    return {**body, **fields}


def chat(**fields: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "cache_salt": SALT}
    return {**body, **fields}


IDS = {"return_token_ids": True}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
CONTINUOUS = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        pytest.param("/v1/completions", completion(), 200, id="completion"),
        pytest.param("/v1/completions", completion(cache_salt=SALT + "-b"), 200, id="completion-other-salt"),
        pytest.param("/v1/completions", completion(**IDS), 200, id="completion-asking-token-ids"),
        pytest.param("/v1/completions", completion(echo=True), 200, id="completion-echo"),
        pytest.param("/v1/completions", completion(stream=True), 200, id="stream"),
        pytest.param("/v1/completions", completion(stream=True, max_tokens=1), 200, id="stream-one-token"),
        pytest.param("/v1/completions", completion(stream=True, echo=True), 200, id="stream-echo"),
        pytest.param("/v1/completions", completion(**USAGE), 200, id="stream-asking-usage"),
        pytest.param("/v1/completions", completion(**USAGE, **IDS), 200, id="stream-asking-everything"),
        pytest.param("/v1/completions", completion(**CONTINUOUS), 200, id="stream-continuous-usage"),
        pytest.param(
            "/v1/completions", completion(stream=True, n=2, seed=1, temperature=1), 200, id="stream-n2"
        ),
        pytest.param("/v1/chat/completions", chat(), 200, id="chat"),
        pytest.param("/v1/chat/completions", chat(**IDS), 200, id="chat-asking-token-ids"),
        pytest.param("/v1/chat/completions", chat(stream=True), 200, id="chat-stream"),
        pytest.param(
            "/v1/chat/completions", chat(stream=True, max_tokens=1), 200, id="chat-stream-one-token"
        ),
        pytest.param(
            "/v1/chat/completions", chat(stream=True, **IDS), 200, id="chat-stream-asking-token-ids"
        ),
        pytest.param("/v1/chat/completions", chat(**USAGE), 200, id="chat-stream-asking-usage"),
        pytest.param("/v1/chat/completions", chat(**USAGE, **IDS), 200, id="chat-stream-asking-everything"),
        pytest.param("/v1/chat/completions", chat(**CONTINUOUS), 200, id="chat-stream-continuous-usage"),
        pytest.param("/v1/completions", completion(model="nope"), 404, id="unknown-model"),
        pytest.param("/v1/completions", completion(prompt=PROMPT * 8), 400, id="too-long"),
    ],
)
def test_clients_get_what_vllm_sends(
    real_vllm: VLLMServer, gateway: str, recorder: KeptRecords, path: str, body: dict[str, Any], status: int
) -> None:
    headers = {"Content-Type": "application/json"}
    call("POST", real_vllm.base_url + path, body, headers)  # the prompt is cached from here on
    recorded = len(recorder.records)

    def through_and_direct() -> tuple[Answer, Answer]:
        return call("POST", gateway + path, body, headers), call(
            "POST", real_vllm.base_url + path, body, headers
        )

    through, direct = through_and_direct()
    calls = 1
    while event_count(through) != event_count(direct) and calls < 3:  # framed apart by timing: ask again
        through, direct = through_and_direct()
        calls += 1
    assert through.status == direct.status == status
    assert through.headers == direct.headers
    if body.get("n", 1) == 1:
        assert masked(through.body) == masked(direct.body)
    else:  # vLLM interleaves the choices' chunks in an order that varies from call to call
        assert sorted(masked(through.body).split(b"\n\n")) == sorted(masked(direct.body).split(b"\n\n"))
    if status == 200:
        wait_for(lambda: len(recorder.records) == recorded + calls)  # one record per call
        record = recorder.records[-1]
        assert record.cached_tokens is not None and record.cached_tokens > 0
        assert record.prompt_token_ids is not None or body.get("echo")


def event_count(answer: Answer) -> int:
    """A stream's events. vLLM merges the tokens its engine made while the API server was busy into one
    chunk (RequestOutputCollector), so two streams of the same tokens may be framed differently: that
    is timing, not the gateway, and the pair is asked again."""
    return answer.body.count(b"\n\ndata: ")


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/version", "/tokenize"])
def test_other_paths_pass_unchanged(real_vllm: VLLMServer, gateway: str, path: str) -> None:
    method, body = ("POST", {"prompt": PROMPT}) if path == "/tokenize" else ("GET", None)
    through, direct = call(method, gateway + path, body), call(method, real_vllm.base_url + path, body)
    assert (through.status, through.headers, masked(through.body)) == (
        direct.status,
        direct.headers,
        masked(direct.body),
    )
