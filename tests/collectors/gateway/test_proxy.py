"""The gateway over real sockets: an aiohttp client, the gateway, and a simulated vLLM server behind it.

Each comparison restarts the simulated server before the call through the gateway and before the
direct call, so both meet the same cache and the same random output tokens; only the answer's id
and creation second differ from call to call, and are masked.
"""

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from collectors.records import canonical_request_id
from simulator.server import ServerConfig
from tests.support.background import serving_app
from tests.support.captures import load_json
from tests.support.ports import unused_ports
from tests.support.running_gateway import Answer, KeptRecords, call, masked, running_gateway, wait_for
from tests.support.simulated_fleet import local_config, running_fleet

PROMPT = load_json("completion-salt-a-1.json")["request"]["prompt"]
MESSAGES = [{"role": "system", "content": PROMPT[:400]}, {"role": "user", "content": "What does red mean?"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerConfig]:
    with running_fleet([local_config()]) as configs:
        yield configs[0]


@pytest.fixture(scope="module")
def recorder() -> KeptRecords:
    return KeptRecords()


@pytest.fixture(scope="module")
def gateway(upstream: ServerConfig, recorder: KeptRecords) -> Iterator[str]:
    with running_gateway(upstream.base_url, recorder) as url:
        yield url


@pytest.fixture(autouse=True)
def forget(recorder: KeptRecords) -> None:
    recorder.records.clear()
    recorder.rejected.clear()


def restart(upstream: ServerConfig) -> None:
    assert call("POST", upstream.base_url + "/_simulator/restart").status == 200


def both(upstream: ServerConfig, gateway: str, path: str, body: Any, **headers: str) -> tuple[Answer, Answer]:
    """The same request through the gateway and directly, each to a freshly restarted server."""
    restart(upstream)
    through = call("POST", gateway + path, body, {"Content-Type": "application/json", **headers})
    restart(upstream)
    direct = call("POST", upstream.base_url + path, body, {"Content-Type": "application/json", **headers})
    return through, direct


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, **fields}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **fields}


IDS = {"return_token_ids": True}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
CASES = [
    pytest.param("/v1/completions", completion(), id="completion"),
    pytest.param("/v1/completions", completion(cache_salt="tenant-a"), id="completion-salted"),
    pytest.param("/v1/completions", completion(**IDS), id="completion-asking-token-ids"),
    pytest.param("/v1/completions", completion(**USAGE), id="stream-asking-usage"),
    pytest.param("/v1/completions", completion(**USAGE, **IDS), id="stream-asking-everything"),
    pytest.param("/v1/completions", load_json("completion-stream.request.json"), id="captured-stream"),
    pytest.param(
        "/v1/completions",
        completion(stream=True),
        id="stream",
    ),
    pytest.param("/v1/chat/completions", chat(**IDS), id="chat-asking-token-ids"),
    pytest.param("/v1/chat/completions", chat(**USAGE, **IDS), id="chat-stream-asking-everything"),
    pytest.param("/v1/chat/completions", chat(), id="chat"),
    pytest.param(
        "/v1/chat/completions",
        chat(stream=True),
        id="chat-stream",
    ),
]


@pytest.mark.parametrize(("path", "body"), CASES)
def test_clients_get_the_answer_vllm_would_send_them(
    upstream: ServerConfig, gateway: str, recorder: KeptRecords, path: str, body: dict[str, Any]
) -> None:
    through, direct = both(upstream, gateway, path, body)
    assert through.status == direct.status == 200
    assert through.headers == direct.headers
    assert masked(through.body) == masked(direct.body)
    wait_for(lambda: len(recorder.records) == 1)


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", completion(model="nope"), 404),
        ("/v1/completions", completion(max_tokens=0), 400),
        ("/v1/completions", completion(prompt=PROMPT * 8), 400),  # longer than max_model_len
        ("/v1/completions", completion(stream=True, max_tokens=-1), 400),
        ("/v1/chat/completions", chat(messages=[]), 400),
        ("/v1/completions", b"{not json", 400),
        ("/v1/completions", b"[1, 2]", 400),
    ],
)
def test_errors_pass_unchanged_and_are_not_recorded(
    upstream: ServerConfig, gateway: str, recorder: KeptRecords, path: str, body: Any, status: int
) -> None:
    through, direct = both(upstream, gateway, path, body)
    assert through == direct and through.status == status
    time.sleep(0.1)
    assert recorder.records == []


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("GET", "/v1/models?limit=1&x=%2F", None),
        ("GET", "/metrics", None),
        ("GET", "/health", None),
        ("GET", "/version", None),
        ("POST", "/tokenize", {"prompt": PROMPT}),
        ("POST", "/detokenize", {"tokens": [1639, 389, 262]}),
        ("GET", "/v1/completions", None),  # 405
        ("GET", "/no/such/path", None),  # 404
    ],
)
def test_other_paths_pass_unchanged(
    upstream: ServerConfig, gateway: str, recorder: KeptRecords, method: str, path: str, body: Any
) -> None:
    through = call(method, gateway + path, body)
    direct = call(method, upstream.base_url + path, body)
    assert (through.status, through.headers) == (direct.status, direct.headers)
    assert masked(through.body) == masked(direct.body)
    assert recorder.records == []


def test_a_record_holds_what_the_client_saw_and_the_headers_it_sent(
    upstream: ServerConfig, gateway: str, recorder: KeptRecords
) -> None:
    headers = {
        "X-Prefixscope-Tenant": "acme",
        "X-Prefixscope-Template": "support",
        "X-Prefixscope-Template-Version": "4f2a9c1",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    restart(upstream)
    started = time.perf_counter()
    answers = [
        call("POST", gateway + "/v1/completions", completion(cache_salt="s1"), headers) for _ in range(2)
    ]
    elapsed = time.perf_counter() - started
    tokens = json.loads(call("POST", upstream.base_url + "/tokenize", {"prompt": PROMPT}).body)["tokens"]
    wait_for(lambda: len(recorder.records) == 2)
    for answer, record in zip(answers, recorder.records, strict=True):
        seen = json.loads(answer.body)
        assert record.request_id == canonical_request_id(seen["id"]) and record.model == "tiny"
        assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (
            seen["usage"]["prompt_tokens"],
            seen["usage"]["prompt_tokens_details"]["cached_tokens"],
            seen["usage"]["completion_tokens"],
        )
        assert record.prompt_token_ids == tokens and seen["choices"][0]["prompt_token_ids"] is None
        assert (record.tenant, record.template, record.template_version) == ("acme", "support", "4f2a9c1")
        assert record.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and record.cache_salt == "s1"
        assert record.client_ttft_seconds is not None and 0 < record.client_ttft_seconds < elapsed
    assert [r.cached_tokens for r in recorder.records] == [0, 160]


def test_a_stream_records_its_usage_and_prompt_and_the_client_sees_neither(
    upstream: ServerConfig, gateway: str, recorder: KeptRecords
) -> None:
    restart(upstream)
    answer = call("POST", gateway + "/v1/completions", completion(stream=True, cache_salt="s2"))
    assert b'"usage"' not in answer.body and b'"prompt_token_ids":null' in answer.body
    wait_for(lambda: len(recorder.records) == 1)
    (record,) = recorder.records
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (191, 0, 4)
    assert record.prompt_token_ids is not None and len(record.prompt_token_ids) == 191
    first_chunk = json.loads(answer.body.split(b"\n\n")[0].removeprefix(b"data: "))
    assert record.request_id == canonical_request_id(first_chunk["id"])


def test_a_request_id_header_names_the_request(
    upstream: ServerConfig, gateway: str, recorder: KeptRecords
) -> None:
    call("POST", gateway + "/v1/completions", completion(), {"X-Request-Id": "req-0001"})
    wait_for(lambda: len(recorder.records) == 1)
    assert recorder.records[0].request_id == "req-0001"  # vLLM's id (cmpl-req-0001) is built on it


def test_an_unreachable_upstream_is_a_bad_gateway_and_no_record() -> None:
    recorder = KeptRecords()
    (closed,) = unused_ports(1)
    with running_gateway(f"http://127.0.0.1:{closed}", recorder) as url:
        answer = call("POST", url + "/v1/completions", completion())
    assert answer.status == 502 and recorder.records == []


async def _slow_stream(request: web.Request) -> web.StreamResponse:
    """Two events a second apart, like a model that takes its time over the second token."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunk = {"id": "cmpl-slow", "model": "m", "choices": [{"index": 0, "text": "a", "finish_reason": None}]}
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await asyncio.sleep(1.0)
    usage = {"prompt_tokens": 2, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}
    last = {
        "id": "cmpl-slow",
        "choices": [{"index": 0, "text": "b", "finish_reason": "stop"}],
        "usage": usage,
    }
    await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
    return response


@pytest.fixture
def slow_upstream() -> Iterator[str]:
    with serving(_slow_stream) as url:
        yield url


@contextmanager
def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Iterator[str]:
    """An upstream answering /v1/completions with `handler`, on a free port, until the block ends."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    with serving_app(app) as url:
        yield url


def test_a_stream_is_forwarded_as_it_comes_and_ttft_is_its_first_content(slow_upstream: str) -> None:
    recorder = KeptRecords()

    async def first_and_last(url: str) -> tuple[float, float, bytes]:
        started = time.perf_counter()
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
            async with session.post(url + "/v1/completions", json=body) as response:
                first = await response.content.readuntil(b"\n\n")
                first_at = time.perf_counter() - started
                rest = await response.read()
        return first_at, time.perf_counter() - started, first + rest

    with running_gateway(slow_upstream, recorder) as url:
        first_at, last_at, body = asyncio.run(first_and_last(url))
        wait_for(lambda: len(recorder.records) == 1)
    assert first_at < 0.5 < 1.0 <= last_at
    assert body.count(b"data: ") == 3
    (record,) = recorder.records
    assert record.client_ttft_seconds is not None and record.client_ttft_seconds < 0.5
    assert record.cached_tokens == 0 and record.request_id == "slow"


def _late_stream(answered: threading.Event) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A stream whose headers come half a second late (a long prefill before the first byte); the
    gateway may go away meanwhile (its client did), as vLLM's clients do. `answered` is set when
    the upstream is done with it."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.5)
        try:
            return await _slow_stream(request)
        except ConnectionResetError:
            return web.Response()
        finally:
            answered.set()

    return handler


def test_a_client_gone_before_its_stream_begins_is_no_error_and_no_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Seen when make run stops: the load generator goes first, its requests' streams still coming.
    recorder = KeptRecords()
    answered = threading.Event()
    body = json.dumps({"prompt": "hi", "stream": True}).encode()
    with serving(_late_stream(answered)) as upstream, running_gateway(upstream, recorder) as url:
        gateway_port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", gateway_port)) as client:
            client.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        assert answered.wait(10)  # the upstream answered after the client had gone
        later = call(
            "POST",
            url + "/v1/completions",
            body={"prompt": "hi", "stream": True},
            headers={"Content-Type": "application/json"},
        )
        wait_for(lambda: len(recorder.records) == 1)
    assert later.status == 200  # the gateway serves on
    assert [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert len(recorder.records) == 1  # the unseen answer is not recorded as served
