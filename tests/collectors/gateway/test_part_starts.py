"""The gateway learns where a chat request's parts start from its upstream's /tokenize, after the
answer went out: the simulated vLLM (whose /tokenize renders a chat body as its chat completion does),
and upstreams whose /tokenize fails or renders another prompt, whose records are kept without starts."""

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aiohttp import web

from collectors.errors import RejectReason
from simulator.server import ServerConfig
from tests.collectors.test_parts import BODY
from tests.support.background import serving_app
from tests.support.running_gateway import KeptRecords, call, running_gateway, wait_for
from tests.support.simulated_fleet import local_config, running_fleet

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerConfig]:
    with running_fleet([local_config()]) as configs:
        yield configs[0]


def test_a_chat_record_carries_where_each_of_its_parts_starts(upstream: ServerConfig) -> None:
    recorder = KeptRecords()
    body = {
        **BODY,
        "max_tokens": 1,
        "chat_template_kwargs": {"reasoning_effort": "low", "enable_thinking": False},
    }
    with running_gateway(upstream.base_url, recorder) as gateway:
        assert call("POST", gateway + "/v1/chat/completions", body, JSON).status == 200
        wait_for(lambda: len(recorder.records) == 1)
    (record,) = recorder.records
    assert record.parts is not None and record.prompt_token_ids is not None
    starts = record.parts.starts
    # PARTS_CHAT_TEMPLATE: effort, tools, then the messages, and thinking turned off at the very end.
    order = ["reasoning_effort", "tools", "system", "history", "messages", "template_kwargs"]
    assert sorted(starts, key=starts.__getitem__) == order
    assert starts["reasoning_effort"] > 0 and starts["template_kwargs"] < len(record.prompt_token_ids)
    assert recorder.codes == []


async def _chat(request: web.Request) -> web.Response:
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}
    choice = {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}
    return web.json_response({"id": "chatcmpl-x", "model": "tiny", "choices": [choice], "usage": usage,
                              "prompt_token_ids": [1, 2, 3]})  # fmt: skip


async def _failing(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "boom"}}, status=500)


async def _another_prompt(request: web.Request) -> web.Response:
    return web.json_response({"count": 2, "max_model_len": 512, "tokens": [7, 8]})


@contextmanager
def chat_upstream(tokenize: Any) -> Iterator[str]:
    """An upstream answering chat completions (prompt ids [1, 2, 3]) and /tokenize with `tokenize`."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/tokenize", tokenize)
    with serving_app(app) as url:
        yield url


@pytest.mark.parametrize(
    ("tokenize", "detail"),
    [(_failing, "part starts: /tokenize answered 500"),
     (_another_prompt, "part starts: /tokenize rendered another prompt than the one answered for")],
)  # fmt: skip
def test_a_failed_look_up_is_counted_and_the_record_kept_without_starts(tokenize: Any, detail: str) -> None:
    recorder = KeptRecords()
    with chat_upstream(tokenize) as upstream, running_gateway(upstream, recorder) as gateway:
        answer = call("POST", gateway + "/v1/chat/completions", {**BODY, "max_tokens": 1}, JSON)
        assert answer.status == 200 and json.loads(answer.body)["prompt_token_ids"] is None
        wait_for(lambda: len(recorder.records) == 1)
    (record,) = recorder.records
    assert record.parts is not None and record.parts.starts == {} and record.prompt_token_ids == [1, 2, 3]
    assert (recorder.codes, recorder.rejected) == ([RejectReason.PART_STARTS_UNKNOWN], [detail])


RELEASED = threading.Event()


async def _held_back(request: web.Request) -> web.Response:
    """The prompt's own ids, once the test has its answer (a gateway waiting for them would hang)."""
    await asyncio.get_running_loop().run_in_executor(None, RELEASED.wait, 10)
    return web.json_response({"count": 3, "max_model_len": 512, "tokens": [1, 2, 3]})


def test_the_look_ups_come_after_the_answer_went_out() -> None:
    recorder = KeptRecords()
    with chat_upstream(_held_back) as upstream, running_gateway(upstream, recorder) as gateway:
        answer = call("POST", gateway + "/v1/chat/completions", {**BODY, "max_tokens": 1}, JSON)
        assert answer.status == 200 and recorder.records == []
        RELEASED.set()
        wait_for(lambda: len(recorder.records) == 1)
    (record,) = recorder.records
    assert record.parts is not None and record.parts.starts["messages"] == 3 and recorder.codes == []


TOKENIZED = threading.Event()


async def _noted(request: web.Request) -> web.Response:
    TOKENIZED.set()
    return web.json_response({"count": 3, "max_model_len": 512, "tokens": [1, 2, 3]})


def test_none_are_asked_where_the_look_ups_are_turned_off() -> None:
    """PREFIXSCOPE_GATEWAY_PART_STARTS_AT_ONCE=0: the record goes at once, without starts, and the
    server's /tokenize is never called (its API process spared the tokenizations)."""
    recorder = KeptRecords()
    with chat_upstream(_noted) as upstream, running_gateway(upstream, recorder, starts_at_once=0) as gateway:
        answer = call("POST", gateway + "/v1/chat/completions", {**BODY, "max_tokens": 1}, JSON)
        assert answer.status == 200
        wait_for(lambda: len(recorder.records) == 1)
    (record,) = recorder.records
    assert record.parts is not None and record.parts.starts == {} and recorder.codes == []
    assert not TOKENIZED.is_set()
