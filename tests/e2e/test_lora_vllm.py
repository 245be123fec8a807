"""LoRA requests on a real vLLM CPU server serving an adapter, and on the simulator serving the same.

The real server is the recipe's (tests/support/vllm_cpu.py) plus ``--enable-lora --lora-modules
support-lora=lora-adapter``: the tiny random adapter of build_tiny_lora.py, named by a path relative
to the server's working directory. vLLM 0.32 hashes ``("lora", name, path)`` into every block of the
adapter's requests, with the path verbatim, so the recorded hashes do not depend on where the
repository lives. The simulator serves the same adapter under the same name and path.

Every check runs on both servers (the real one is skipped with the reason when vLLM is unavailable
here); the last compares the two. Each server gets the same four completions, one at a time, of one
100-token prompt (three full blocks) and ``max_tokens`` 1, so every stored block is a prompt block:
for the adapter, for the adapter under a salt, for the base model, and for the adapter again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import zmq

from app.domain.blockhash import LoraKey, block_hash_chain, hash_block
from app.fleet.selectors import request_lora
from app.fleet.services import register_server
from app.traffic.tasks import scrape_server
from collectors.kv_events.parse import BlockStored
from collectors.models.parse import ServedModels, parse_models
from tests.support.probes import drain, get_text, joined_subscriber, post_json
from tests.support.simulated_fleet import running_fleet
from tests.support.simulated_vllm import description, simulated_config
from tests.support.vllm_cpu import (
    DATA_DIR,
    LORA_DIR,
    SERVED_MODEL_NAME,
    VLLMServer,
    VLLMUnavailable,
    build_lora_adapter,
    build_model,
    install,
    serve,
)

pytestmark = pytest.mark.timeout(1800)  # a first install and start of the real server take minutes

ADAPTER = "support-lora"
ADAPTER_PATH = str(LORA_DIR.relative_to(DATA_DIR))  # the server runs in DATA_DIR
LORA_FLAGS = ("--enable-lora", "--lora-modules", f"{ADAPTER}={ADAPTER_PATH}", "--max-lora-rank", "8",
              "--max-loras", "1")  # fmt: skip
REAL_LOG = DATA_DIR / "server-lora.log"  # the session's server may be running, writing server.log
PROMPT = list(range(1000, 1100))
SALT = "tenant-a"
# (name, model, cache_salt), sent in this order.
REQUESTS = (
    ("adapter", ADAPTER, None),
    ("salted", ADAPTER, SALT),
    ("base", SERVED_MODEL_NAME, None),
    ("adapter-again", ADAPTER, None),
)


@dataclass(frozen=True, slots=True)
class Traffic:
    """What a server made of REQUESTS: its model list, each request's cached tokens, its stored blocks."""

    models: ServedModels
    cached_tokens: dict[str, int]
    stored: list[BlockStored]


@dataclass(frozen=True, slots=True)
class Side:
    server: VLLMServer
    traffic: Traffic


def run_traffic(server: VLLMServer) -> Traffic:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    subscriber = joined_subscriber(context, server.kv_endpoint, server.topic)
    try:
        models = parse_models(get_text(f"{server.base_url}/v1/models"))
        cached = {}
        for name, model, salt in REQUESTS:
            body: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
            if salt:
                body["cache_salt"] = salt
            answer = post_json(f"{server.base_url}/v1/completions", body)
            cached[name] = int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
        messages = drain(subscriber)
    finally:
        subscriber.close(linger=0)
        context.term()
    assert all(not message.batch.rejected for message in messages), "a KV event could not be decoded"
    stored = [event for m in messages for event in m.batch.events if isinstance(event, BlockStored)]
    return Traffic(models, cached, stored)


@pytest.fixture(scope="module")
def real_side() -> Iterator[Side]:
    """A real vLLM CPU server of its own, serving the tiny adapter (the session's serves none)."""
    stack = contextlib.ExitStack()
    try:
        install()
        build_model()
        build_lora_adapter()
        server = stack.enter_context(serve(extra_flags=LORA_FLAGS, log_path=REAL_LOG))
    except VLLMUnavailable as exc:
        pytest.skip(f"vLLM CPU server unavailable: {exc.reason}")
    with stack:
        yield Side(server, run_traffic(server))


@pytest.fixture(scope="module")
def simulated_side() -> Iterator[Side]:
    started = time.monotonic()
    # No OTLP endpoint: these checks read no spans.
    config = replace(simulated_config(otlp_endpoint=""), lora_adapters=(LoraKey(ADAPTER, ADAPTER_PATH),))
    with running_fleet([config]):
        server = description(config, time.monotonic() - started)
        yield Side(server, run_traffic(server))


@pytest.fixture(params=[pytest.param("real", marks=pytest.mark.vllm), "simulated"])
def side(request: pytest.FixtureRequest) -> Side:
    found: Side = request.getfixturevalue(f"{request.param}_side")
    return found


def wires(*, cache_salt: str | None = None, lora: LoraKey | None = None) -> tuple[int, ...]:
    return tuple(block.wire for block in block_hash_chain(PROMPT, 32, cache_salt=cache_salt, lora=lora))


def test_the_model_list_gives_the_adapter_the_path_the_server_was_given(side: Side) -> None:
    assert side.traffic.models == ServedModels(
        base_models=(SERVED_MODEL_NAME,), lora_adapters={ADAPTER: ADAPTER_PATH}
    )


@pytest.mark.django_db
def test_the_chain_of_a_lora_request_is_what_the_server_stored(side: Side) -> None:
    registered = register_server(
        name="lora-server", base_url=side.server.base_url, metrics_url=side.server.metrics_url
    )
    scrape_server(registered.pk)  # reads /metrics and /v1/models, as the schedule does
    registered.refresh_from_db()
    lora = request_lora(registered, ADAPTER)
    block_size = registered.block_size
    assert (lora, block_size) == (LoraKey(ADAPTER, ADAPTER_PATH), 32)

    roots = [tuple(event.block_hashes) for event in side.traffic.stored if event.parent_block_hash is None]
    base = request_lora(registered, SERVED_MODEL_NAME)
    assert roots == [wires(lora=lora), wires(cache_salt=SALT, lora=lora), wires(lora=base)]
    # What Prefixscope hashed before, the adapter's name alone, matches nothing the server stored.
    name_only, parent = [], None
    for start in range(0, len(PROMPT) - 32 + 1, 32):
        block = hash_block(parent, PROMPT[start : start + 32], (("lora", ADAPTER),))
        name_only.append(block.wire)
        parent = block.digest
    assert not set(name_only) & {h for root in roots for h in root}


def test_an_adapters_blocks_serve_its_own_requests_only(side: Side) -> None:
    assert side.traffic.cached_tokens == {"adapter": 0, "salted": 0, "base": 0, "adapter-again": 96}


def test_events_name_the_adapter_on_every_block_and_the_salt_after_it(side: Side) -> None:
    shown = [(event.lora_name, event.extra_keys) for event in side.traffic.stored]

    assert shown == [
        (ADAPTER, ((ADAPTER,),) * 3),
        (ADAPTER, ((ADAPTER, SALT), (ADAPTER,), (ADAPTER,))),
        (None, (None,) * 3),
    ]
    assert [event.lora_id for event in side.traffic.stored] == [1, 1, None]


@pytest.mark.vllm
def test_the_simulator_serves_lora_requests_as_real_vllm_does(real_side: Side, simulated_side: Side) -> None:
    def seen(traffic: Traffic) -> list[tuple[object, ...]]:
        return [(e.block_hashes, e.parent_block_hash, e.lora_name, e.extra_keys) for e in traffic.stored]

    real, simulated = real_side.traffic, simulated_side.traffic
    assert simulated.models == real.models
    assert simulated.cached_tokens == real.cached_tokens
    assert seen(simulated) == seen(real)
