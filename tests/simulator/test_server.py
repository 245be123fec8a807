"""The simulated vLLM server over real HTTP and ZMQ, checked against the real captures."""

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import zmq
import zmq.asyncio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from app.domain.blockhash import LoraKey, block_hash_chain
from collectors.kv_events.client import fetch_replay
from collectors.kv_events.parse import BlockStored, decode_sub_message
from collectors.metrics.parse import cache_config, parse_metrics, prefix_cache_totals
from collectors.models.parse import ServedModels, parse_models
from simulator.cache import PrefixCache
from simulator.fleet import configs_from_args, parse_args
from simulator.server import ServerConfig, SimulatedServer
from tests.support.captures import VLLM_CPU_FIXTURES, captured_traffic, kv_block_metric_counts, load_json
from tests.support.otlp_receiver import attributes, run_otlp_receiver
from tests.support.simulated_fleet import joined_subscriber, local_config, running_fleet


@pytest.fixture(scope="module")
def server() -> Iterator[ServerConfig]:
    with running_fleet([local_config()]) as configs:
        yield configs[0]


def post(config: ServerConfig, path: str, body: dict[str, object], **headers: str) -> httpx.Response:
    return httpx.post(config.base_url + path, json=body, headers=headers, timeout=10)


def test_captured_traffic_gets_the_cached_tokens_real_vllm_reported() -> None:
    with running_fleet([local_config()]) as (config,):
        assert set(block_counts(config).values()) == {0}
        for number, (body, expected) in enumerate(captured_traffic()):
            if body.get("stream"):
                with httpx.stream(
                    "POST", config.base_url + "/v1/completions", json=body, timeout=10
                ) as response:
                    usage = json.loads([line for line in response.iter_lines() if '"usage"' in line][-1][6:])[
                        "usage"
                    ]
            else:
                usage = post(config, "/v1/completions", body).json()["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == expected, f"request {number}"
        # --kv-cache-metrics: what the real server observed of the same traffic (61 lifetimes, 15 gaps)
        captured = kv_block_metric_counts((VLLM_CPU_FIXTURES / "metrics-after.txt").read_text())
        assert block_counts(config) == captured


def block_counts(config: ServerConfig) -> dict[str, float]:
    return kv_block_metric_counts(httpx.get(config.base_url + "/metrics").text)


def test_the_answer_has_vllms_shape_and_honours_x_request_id(server: ServerConfig) -> None:
    capture = load_json("completion-with-request-id.json")
    answer = post(
        server, "/v1/completions", capture["request"], **{"X-Request-Id": "req-fixture-0001"}
    ).json()
    assert answer["id"] == capture["response"]["id"] == "cmpl-req-fixture-0001"
    assert set(answer) >= set(capture["response"]) - {"ec_transfer_params", "metrics"}
    assert set(answer["choices"][0]) >= {"index", "text", "finish_reason", "token_ids", "prompt_token_ids"}
    assert len(answer["choices"][0]["token_ids"]) == capture["request"]["max_tokens"]


def test_a_stream_ends_with_the_usage_chunk_like_the_capture(server: ServerConfig) -> None:
    request = load_json("completion-stream.request.json")
    body = request.get("request", request)
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=10) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    usage_chunk = json.loads(lines[-2][6:])
    assert usage_chunk["choices"] == [] and set(usage_chunk["usage"]["prompt_tokens_details"]) == {
        "cached_tokens"
    }
    first = json.loads(lines[0][6:])["choices"][0]
    assert first["prompt_token_ids"] and first["finish_reason"] is None


def test_chat_completions_render_the_template_and_reuse_the_cache(server: ServerConfig) -> None:
    messages = [{"role": "system", "content": "You answer questions about routers. " * 12},
                {"role": "user", "content": "How do I reset it?"}]  # fmt: skip
    first = post(
        server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 3}
    ).json()
    second = post(
        server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 3}
    ).json()
    assert first["object"] == "chat.completion" and first["choices"][0]["message"]["role"] == "assistant"
    prompt = second["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // 32 * 32
    # Chat usage also tells the prompt tokens the request wrote to the cache: its full blocks, less the hit.
    for answer in (first, second):
        details = answer["usage"]["prompt_tokens_details"]
        assert details["created_cache_tokens"] == prompt // 32 * 32 - details["cached_tokens"]


def test_a_chat_stream_opens_with_the_role_and_then_streams_content_alone(server: ServerConfig) -> None:
    # As vLLM 0.32 (tests/e2e/test_answer_shapes.py compares it with the real server).
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 3,
            "stream": True, "return_token_ids": True}  # fmt: skip
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=10) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    opening, *tokens = [json.loads(line[6:]) for line in lines[:-1]]
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert opening["prompt_token_ids"] and opening["prompt_text"] is None
    assert [list(chunk["choices"][0]["delta"]) for chunk in tokens] == [["content"]] * 3
    assert [len(chunk["choices"][0]["token_ids"]) for chunk in tokens] == [1, 1, 1]
    assert ["stop_reason" in chunk["choices"][0] for chunk in tokens] == [False, False, True]
    assert ["system_fingerprint" in chunk for chunk in tokens] == [False, False, True]
    assert all("prompt_token_ids" not in chunk for chunk in tokens)


def test_tokenize_and_detokenize_answer_like_the_capture(server: ServerConfig) -> None:
    captured = load_json("tokenize-prompt.json")
    text = httpx.post(server.base_url + "/detokenize", json={"tokens": captured["tokens"]}).json()["prompt"]
    tokens = httpx.post(server.base_url + "/tokenize", json={"prompt": text}).json()
    assert tokens["tokens"] == captured["tokens"] and tokens["count"] == captured["count"]


def test_tokenize_renders_a_chat_body_as_the_chat_completion_does(server: ServerConfig) -> None:
    # vLLM 0.32: /tokenize takes tools, template arguments and add_generation_prompt as the chat
    # completion does; a chat completion's top-level reasoning_effort reaches the template as the
    # argument, with enable_thinking (its ChatCompletionRequest.build_chat_params), /tokenize has none.
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is it?"}]
    body = {"messages": messages, "tools": tools, "chat_template_kwargs": {"tone": "dry"}}
    chat = post(server, "/v1/chat/completions", {**body, "reasoning_effort": "none", "max_tokens": 1,
                                                 "return_token_ids": True}).json()  # fmt: skip
    kwargs = {"tone": "dry", "reasoning_effort": "none", "enable_thinking": False}
    tokens = post(server, "/tokenize", {**body, "chat_template_kwargs": kwargs}).json()["tokens"]
    assert tokens == chat["prompt_token_ids"]
    text = httpx.post(server.base_url + "/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert "Reasoning effort: none" in text and "Tool: " in text and text.endswith("<think>\n\n</think>\n\n")
    cut = post(server, "/tokenize", {**body, "add_generation_prompt": False}).json()["tokens"]
    assert (
        httpx.post(server.base_url + "/detokenize", json={"tokens": cut})
        .json()["prompt"]
        .endswith("Where is it?<|im_end|>\n")
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [({"model": "tiny"}, "prompt"), ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
     ({"prompt": "hi", "max_tokens": 513}, "max_tokens"), ({"prompt": "hi", "cache_salt": ""}, "cache_salt"),
     ({"prompt": "hi " * 600}, "input_tokens")],
)  # fmt: skip
def test_bad_requests_are_refused_naming_the_field(
    server: ServerConfig, body: dict[str, object], field: str
) -> None:
    answer = post(server, "/v1/completions", body)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == field  # vLLM 0.32's ErrorResponse


@pytest.mark.parametrize(("max_tokens", "generated"), [(10, 2), (None, 2), (1, 1)])
def test_max_tokens_are_cut_to_what_the_context_leaves(
    server: ServerConfig, max_tokens: int | None, generated: int
) -> None:
    # As vLLM's get_max_tokens: a prompt 2 tokens short of max_model_len (512) leaves room for 2.
    body: dict[str, object] = {"prompt": [1639] * 510}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    answer = post(server, "/v1/completions", body).json()
    assert answer["usage"]["completion_tokens"] == generated
    assert answer["choices"][0]["finish_reason"] == "length"


def test_metrics_expose_the_families_the_collectors_read(server: ServerConfig) -> None:
    before = prefix_cache_totals(parse_metrics(httpx.get(server.base_url + "/metrics").text)) or (0.0, 0.0)
    cached = 0
    for body, _ in captured_traffic()[:3]:
        answer = post(server, "/v1/completions", body).json()
        cached += answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    samples = parse_metrics(httpx.get(server.base_url + "/metrics").text)
    real = {s.name for s in parse_metrics((VLLM_CPU_FIXTURES / "metrics-after.txt").read_text())}
    wanted = {
        name
        for name in real
        if (name.startswith("vllm:") and "prefix_cache" in name) or "time_to_first" in name
    }
    wanted |= {"vllm:prompt_tokens_cached_total", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"}
    assert wanted <= {s.name for s in samples}
    config = cache_config(samples)
    assert config is not None and (config.block_size, config.hash_algo) == (32, "sha256_cbor")
    after = prefix_cache_totals(samples)
    assert after is not None and after[1] - before[1] == cached


def test_kv_events_and_replay_carry_the_hashes_of_the_prompts_sent() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with running_fleet([local_config()]) as (config,):
            subscriber, joined = joined_subscriber(context, config)
            capture = load_json("completion-salt-a-1.json")
            post(config, "/v1/completions", capture["request"])
            assert subscriber.poll(5000)
            message = decode_sub_message(subscriber.recv_multipart())
            stored = next(e for e in message.batch.events if isinstance(e, BlockStored))
            prompt_ids = capture["response"]["choices"][0]["prompt_token_ids"]
            chain = block_hash_chain(prompt_ids, 32, cache_salt=capture["request"]["cache_salt"])
            assert list(stored.block_hashes) == [h.wire for h in chain]
            replay = f"tcp://127.0.0.1:{config.replay_port}"
            replies = fetch_replay(context, replay, joined + 1, timeout_seconds=5)
            assert [r.seq for r in replies] == [joined + 1] and replies[0].batch == message.batch
            subscriber.close()
    finally:
        context.destroy(linger=0)


def test_a_restart_starts_the_sequence_and_the_counters_again(server: ServerConfig) -> None:
    post(server, "/v1/completions", load_json("completion-salt-b-1.json")["request"])
    assert httpx.post(server.base_url + "/_simulator/restart").status_code == 200
    assert prefix_cache_totals(parse_metrics(httpx.get(server.base_url + "/metrics").text)) == (0.0, 0.0)
    capture = load_json("completion-salt-b-1.json")
    answer = post(server, "/v1/completions", capture["request"]).json()
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the cache went with the process


def test_llm_request_spans_reach_an_otlp_endpoint_with_vllms_attributes() -> None:
    with run_otlp_receiver() as receiver:
        with running_fleet([local_config(otlp_endpoint=receiver.url)]) as (config,):
            body = load_json("completion-salt-a-1.json")["request"]
            post(config, "/v1/completions", body, **{"X-Request-Id": "r1"})
            chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            post(config, "/v1/chat/completions", chat, **{"X-Request-Id": "h2-0002"})
        spans = receiver.spans()  # the fleet flushed its spans when it stopped

    export = ExportTraceServiceRequest.FromString((VLLM_CPU_FIXTURES / "otlp" / "traces-01.pb").read_bytes())
    captured = export.resource_spans[0].scope_spans[0].spans[0]
    assert [s.name for s in spans] == ["llm_request", "llm_request"]
    assert {a.key for a in captured.attributes} <= {a.key for a in spans[0].attributes}
    values = attributes(spans[0])
    assert (values["gen_ai.request.id"], values["gen_ai.usage.prompt_tokens"]) == ("cmpl-r1-0", 191)
    # vLLM 0.32 names a chat's engine request after the answer itself: no prompt index.
    assert attributes(spans[1])["gen_ai.request.id"] == "chatcmpl-h2-0002"


SUPPORT_LORA = LoraKey("support-lora", "/adapters/support-lora")


def test_a_lora_adapter_has_a_cache_of_its_own_and_says_so_in_its_events() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    body = dict(load_json("completion-salt-b-1.json")["request"])
    body.pop("cache_salt")
    try:
        with running_fleet([local_config(lora_adapters=(SUPPORT_LORA,))]) as (config,):
            subscriber, _ = joined_subscriber(context, config)
            answers = [
                post(config, "/v1/completions", {**body, "model": model}).json()
                for model in ("tiny", "support-lora", "support-lora")
            ]
            unknown = post(config, "/v1/completions", {**body, "model": "nope"})
            events: list[object] = []
            while subscriber.poll(500):
                events += decode_sub_message(subscriber.recv_multipart()).batch.events
            subscriber.close()
    finally:
        context.destroy(linger=0)
    assert [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers] == [0, 0, 160]
    assert unknown.status_code == 404
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert {e.lora_name for e in stored} == {None, "support-lora"}
    prompt_ids = answers[1]["choices"][0]["prompt_token_ids"]
    adapted = next(e for e in stored if e.lora_name == "support-lora")  # the prefill's; decode's follow
    assert list(adapted.block_hashes) == [h.wire for h in block_hash_chain(prompt_ids, 32, lora=SUPPORT_LORA)]
    assert adapted.extra_keys == (("support-lora",),) * len(adapted.block_hashes)


def test_the_model_list_gives_each_adapter_its_path_as_vllm_does() -> None:
    with running_fleet([local_config(lora_adapters=(SUPPORT_LORA,))]) as (config,):
        answer = httpx.get(config.base_url + "/v1/models", timeout=10).text

    assert parse_models(answer) == ServedModels(
        base_models=("tiny",), lora_adapters={"support-lora": "/adapters/support-lora"}
    )


def test_the_fleet_serves_the_adapters_of_lora_modules_as_vllm_reads_them() -> None:
    args = parse_args(["--servers", "1", "--lora-modules", "support-lora=/a/b=c", "sql=org/sql-lora"])

    (config,) = configs_from_args(args)
    assert config.lora_adapters == (LoraKey("support-lora", "/a/b=c"), LoraKey("sql", "org/sql-lora"))
    with pytest.raises(SystemExit):
        parse_args(["--lora-modules", "support-lora"])


def test_a_kv_port_in_use_fails_the_start_naming_it_and_stops_cleanly() -> None:
    config = local_config()
    context = zmq.asyncio.Context()
    taken = context.socket(zmq.PUB)
    taken.bind(f"tcp://127.0.0.1:{config.replay_port}")
    server = SimulatedServer(config, context)
    try:
        with pytest.raises(zmq.ZMQError, match=f"127.0.0.1:{config.replay_port}"):
            asyncio.run(server.start())
        asyncio.run(server.stop())  # nothing was started that needs stopping: no error of its own
    finally:
        taken.close(linger=0)
        context.term()  # returns only once every socket is closed: none was left open


def kv_usage(config: ServerConfig) -> float:
    return gauges(config)[0]


def gauges(config: ServerConfig) -> tuple[float, float]:
    """vllm:kv_cache_usage_perc and vllm:num_requests_running, read at once."""
    samples = parse_metrics(httpx.get(config.base_url + "/metrics", timeout=10).text)
    found = {s.name: s.value for s in samples}
    return found["vllm:kv_cache_usage_perc"], found["vllm:num_requests_running"]


def test_kv_usage_counts_the_blocks_of_running_requests_and_reads_0_between_them() -> None:
    """vLLM's vllm:kv_cache_usage_perc is 1 - free / usable blocks, and a cached block no running
    request holds is free (evictable): the capture reads 0.0 after its traffic, its cache full of
    prefixes. The simulated server reads what a running request holds while it runs (its modelled
    prefill and decode), and 0 again when it has finished, however much of its prefix stays cached."""
    body = dict(load_json("completion-shared-prefix-I.json")["request"]) | {"max_tokens": 8}
    prompt = load_json("completion-shared-prefix-I.json")["response"]["choices"][0]["prompt_token_ids"]
    config = local_config(sleep=True, decode_seconds_per_token=0.25)  # about two seconds of decoding
    alone = PrefixCache(config.block_size, config.num_blocks)  # what the request holds while it runs
    alone.admit("one", prompt)
    alone.append_output("one", [0] * 8)
    with running_fleet([config]):
        assert kv_usage(config) == 0.0
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(post, config, "/v1/completions", body)
            seen = []
            while not answer.done():
                seen.append(gauges(config))
            assert answer.result().status_code == 200
        assert alone.usage == pytest.approx(max(seen)[0]) and alone.usage > 0.1  # read while it ran
        assert max(seen) == (max(seen)[0], 1.0)  # one request running then
        assert gauges(config) == (0.0, 0.0)  # finished: its blocks are free, and cached
        again = post(config, "/v1/completions", body | {"max_tokens": 1}).json()["usage"]
        assert again["prompt_tokens_details"]["cached_tokens"] > 0
        assert kv_usage(config) == 0.0


def test_a_client_gone_mid_stream_ends_the_stream_quietly(
    server: ServerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that hangs up mid-stream (a load generator stopped, a gateway closing) ends the request
    as vLLM aborts it: no 'Error handling request' and traceback from the server."""
    body = {"model": server.model, "prompt": "Tell me everything.", "max_tokens": 480, "stream": True}
    for _ in range(3):  # the hang-up has to land while the server still writes: try a few times
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=10) as response:
            assert next(response.iter_lines()).startswith("data: ")
        time.sleep(0.3)  # the server's next writes meet the closed connection
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []
