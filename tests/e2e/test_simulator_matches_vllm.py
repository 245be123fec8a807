"""The simulator against real vLLM: the same traffic, compared request by request and event by event.

A fresh real vLLM CPU server and a fresh simulated server with the same capacity (block size 32, 48
blocks counting the null block, max_model_len 512, model "tiny") get the same requests, one at a time,
in the same order, in two phases on one cache:

1. ``captured``: the traffic of the shared captures (``tests.support.captures.captured_traffic()``);
2. ``scenario``: the ``vllm-cpu`` scenario's planned requests (seed 0), on the cache phase 1 left.

Every request has ``max_tokens`` forced to 1. The single output token comes from prefill and no
decode step runs, so every block a server stores is a prompt block: its hash depends on the prompt
alone, and the simulator's random output tokens cannot show in the KV events. Compared:

- each request's cached tokens (and prompt tokens);
- each phase's KV events as (type, block_hashes, parent_block_hash), event for event; batch
  boundaries are not compared, and each server's batches must run from seq 0 without a gap, so no
  event was lost to ZMQ's slow joiner;
- the /metrics samples the collectors read exist on both, and their counters agree;
- the ``llm_request`` span attribute keys, request by request, including those vLLM sets only
  when the request's value is truthy.

A fresh real server, not the session's: its cache must start empty, and ``POST /reset_prefix_cache``
is a development route in vLLM 0.32 (``vllm/entrypoints/launchers/api_server/routers.py`` registers
it only when ``VLLM_SERVER_DEV_MODE=1``, which the recipe does not set). A second start costs ~40 s.

The ``vllm-cpu`` scenario has no capacity cut or server restart (its timeline is a salt change and a
template edit, which the planned requests carry), so both servers get the whole scenario and no admin
call; ``test_the_scenario_needs_no_admin_call`` keeps it that way, since the real server has no
``/_simulator/*`` routes.

Known differences
-----------------
- Blocks filled by generated tokens, closed by max_tokens=1: their hashes chain over the output
  tokens, the tiny model's on one side and random ones on the other. Run with the captures' own
  max_tokens (4) and the scenario's (8), the cached tokens still agreed request for request, but 4
  BlockStored hashes of the captured phase differed (the first at event 1) and so did the
  BlockRemoved events that later evicted them. test_real_vllm.py checks such blocks structurally.
- Batching, not exercised: requests go one at a time. Concurrent traffic lets vLLM
  (``--max-num-seqs 4``) schedule several requests in one step, and the simulator admits requests
  one by one, so the order of events within a step could differ; it is not compared here.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import zmq

from collectors.kv_events.parse import BlockRemoved, BlockStored, KVEvent, KVMessage
from simulator.planner import plan_requests
from simulator.scenario import load_scenario, resolve_scenario
from simulator.template_repo import create_repo
from tests.support.captures import captured_traffic
from tests.support.otlp_receiver import OTLPReceiver, attributes, run_otlp_receiver
from tests.support.probes import (
    COLLECTOR_SAMPLES,
    drain,
    joined_subscriber,
    post,
    samples,
    total,
    wait_for_counter,
)
from tests.support.simulated_vllm import serve_simulated
from tests.support.vllm_cpu import DATA_DIR, VLLMServer, VLLMUnavailable, serve

logger = logging.getLogger(__name__)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

SCENARIO = "vllm-cpu"
REPO_START = datetime(2026, 1, 1, tzinfo=UTC)
MAX_TOKENS = 1  # no decode step: every stored block is a prompt block
REAL_LOG = DATA_DIR / "server-comparison.log"  # the session's server may be running, writing server.log
PHASES = ("captured", "scenario")
# vLLM sets these only when the request's value is truthy; see "Known differences".
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:prompt_tokens_cached_total",
)

EventKey = tuple[str, tuple[int, ...], int | None]


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the traffic: ``name`` says where it comes from, in failure messages."""

    phase: str
    name: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Answer:
    """What a server answered: the response id and the usage block's token counts."""

    response_id: str
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Run:
    """What one server made of the traffic: per phase its answers and KV events; the seqs of its
    batches, its /metrics after the traffic, and the attribute keys of each request's span."""

    answers: dict[str, list[Answer]]
    events: dict[str, list[EventKey]]
    seqs: list[int]
    metrics: str
    span_keys: list[frozenset[str]]


def captured_requests() -> list[Request]:
    """The captures' traffic in capture order, with one output token."""
    return [
        Request("captured", f"captured[{i}]", "/v1/completions", {**body, "max_tokens": MAX_TOKENS}, {})
        for i, (body, _cached) in enumerate(captured_traffic())
    ]


def scenario_requests(repo: Path) -> list[Request]:
    """The vllm-cpu scenario's planned requests (seed 0) in plan order, with one output token."""
    scenario = load_scenario(resolve_scenario(SCENARIO))
    commits = create_repo(repo, scenario, REPO_START)
    return [
        Request("scenario", planned.request_id, planned.path, {**planned.body, "max_tokens": MAX_TOKENS},
                dict(planned.headers))
        for planned in plan_requests(scenario, commits, seed=0)
    ]  # fmt: skip


def send(base_url: str, request: Request) -> Answer:
    """Send one request and read its usage, from the JSON answer or a stream's last usage chunk."""
    text = post(base_url + request.path, request.body, headers=request.headers)
    if not request.body.get("stream"):
        answer = json.loads(text)
        return usage_answer(answer["id"], answer["usage"])
    chunks = [
        json.loads(line.removeprefix("data:"))
        for line in text.splitlines()
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]
    usage = next(chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage"))
    return usage_answer(chunks[0]["id"], usage)


def usage_answer(response_id: str, usage: Mapping[str, Any]) -> Answer:
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return Answer(response_id, int(usage["prompt_tokens"]), int(cached))


def event_key(event: KVEvent) -> EventKey:
    """What must match between the servers: the type, the block hashes and the parent."""
    if isinstance(event, BlockStored):
        return ("BlockStored", event.block_hashes, event.parent_block_hash)
    if isinstance(event, BlockRemoved):
        return ("BlockRemoved", event.block_hashes, None)
    return ("AllBlocksCleared", (), None)


def run_traffic(server: VLLMServer, receiver: OTLPReceiver, traffic: Mapping[str, list[Request]]) -> Run:
    """Send each phase's requests in order, one at a time, draining the KV events after each phase."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    subscriber = joined_subscriber(context, server.kv_endpoint, server.topic)
    answers: dict[str, list[Answer]] = {}
    messages: dict[str, list[KVMessage]] = {}
    try:
        for phase, requests in traffic.items():
            answers[phase] = [send(server.base_url, request) for request in requests]
            messages[phase] = drain(subscriber)
    finally:
        subscriber.close(linger=0)
        context.term()
    every = [answer for phase in answers.values() for answer in phase]
    prompt_tokens = sum(answer.prompt_tokens for answer in every)
    metrics = wait_for_counter(server.metrics_url, "vllm:prompt_tokens_total", prompt_tokens)
    batches = [message for phase in messages.values() for message in phase]
    assert all(not message.batch.rejected for message in batches), "a KV event could not be decoded"
    events = {
        phase: [event_key(event) for message in phase_messages for event in message.batch.events]
        for phase, phase_messages in messages.items()
    }
    span_keys = request_span_keys(receiver, [f"{answer.response_id}-0" for answer in every])
    return Run(answers, events, [message.seq for message in batches], metrics, span_keys)


def request_span_keys(receiver: OTLPReceiver, request_ids: Sequence[str]) -> list[frozenset[str]]:
    """The attribute keys of each request's ``llm_request`` span (vLLM's request id is the response
    id plus the choice index); waits for the exporter's batches. A missing span fails."""

    def by_id(spans: Sequence[Any]) -> dict[object, frozenset[str]]:
        found = (attributes(span) for span in spans if span.name == "llm_request")
        return {attrs.get("gen_ai.request.id"): frozenset(attrs) for attrs in found}

    spans = receiver.wait_for(lambda spans: set(request_ids) <= by_id(spans).keys(), timeout=30.0)
    keys = by_id(spans)
    assert [request_id for request_id in request_ids if request_id not in keys] == []
    return [keys[request_id] for request_id in request_ids]


def run_on_fresh_real_server(traffic: Mapping[str, list[Request]]) -> Run:
    """Start a real server of its own (empty cache, counters at 0), run the traffic, stop it.

    Skips, with the reason, when vLLM cannot be installed, built or started here.
    """
    with run_otlp_receiver() as receiver, contextlib.ExitStack() as stack:
        try:
            real = stack.enter_context(serve(otlp_endpoint=receiver.url, log_path=REAL_LOG))
        except VLLMUnavailable as exc:
            pytest.skip(f"vLLM CPU server unavailable: {exc.reason}")
        return run_traffic(real, receiver, traffic)


def run_on_fresh_simulated_server(traffic: Mapping[str, list[Request]]) -> Run:
    with run_otlp_receiver() as receiver, serve_simulated(otlp_endpoint=receiver.url) as simulated:
        return run_traffic(simulated, receiver, traffic)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Request]]:
    repo = tmp_path_factory.mktemp("templates")
    return {"captured": captured_requests(), "scenario": scenario_requests(repo)}


@pytest.fixture(scope="module")
def runs(traffic: dict[str, list[Request]]) -> dict[str, Run]:
    """The same traffic through a fresh real server and a fresh simulated one."""
    runs = {"real": run_on_fresh_real_server(traffic), "simulator": run_on_fresh_simulated_server(traffic)}
    for side, run in runs.items():
        logger.info("%s: %d KV event batches", side, len(run.seqs))
        for phase in PHASES:
            kinds = [kind for kind, _hashes, _parent in run.events[phase]]
            logger.info(
                "%s %s: %d requests, %d cached tokens, %d events (%d BlockStored, %d BlockRemoved)",
                side,
                phase,
                len(run.answers[phase]),
                sum(a.cached_tokens for a in run.answers[phase]),
                len(kinds),
                kinds.count("BlockStored"),
                kinds.count("BlockRemoved"),
            )
    return runs


def test_the_scenario_needs_no_admin_call() -> None:
    # Capacity cuts and restarts are the timeline events aimed at one server (they name it); the real
    # server cannot take their /_simulator/* calls, so the comparison would need a copy without them.
    scenario = load_scenario(resolve_scenario(SCENARIO))
    assert [event for event in scenario.timeline if hasattr(event, "server")] == []


@pytest.mark.parametrize("phase", PHASES)
def test_each_request_reports_the_same_cached_tokens(
    runs: dict[str, Run], traffic: dict[str, list[Request]], phase: str
) -> None:
    real, simulated = runs["real"].answers[phase], runs["simulator"].answers[phase]
    assert len(real) == len(simulated) == len(traffic[phase])
    differing = [
        (request.name, (r.prompt_tokens, r.cached_tokens), (s.prompt_tokens, s.cached_tokens))
        for request, r, s in zip(traffic[phase], real, simulated, strict=True)
        if (r.prompt_tokens, r.cached_tokens) != (s.prompt_tokens, s.cached_tokens)
    ]
    assert differing == [], "(request, real (prompt, cached), simulator (prompt, cached))"
    assert any(answer.cached_tokens for answer in real), "no request hit the cache: nothing compared"


@pytest.mark.parametrize("phase", PHASES)
def test_kv_events_are_identical_event_for_event(runs: dict[str, Run], phase: str) -> None:
    real, simulated = runs["real"].events[phase], runs["simulator"].events[phase]
    assert any(kind == "BlockStored" for kind, _, _ in real), "the real server stored nothing"
    first = next((i for i, pair in enumerate(zip(real, simulated, strict=False)) if pair[0] != pair[1]), None)
    assert first is None, f"event {first}: real {real[first]}, simulator {simulated[first]}"
    assert len(real) == len(simulated)


@pytest.mark.parametrize("side", ["real", "simulator"])
def test_no_kv_batch_was_lost(runs: dict[str, Run], side: str) -> None:
    # A fresh server numbers its batches from 0: a gap or a late start would mean lost events.
    seqs = runs[side].seqs
    assert seqs == list(range(len(seqs)))


def test_both_expose_the_samples_the_collectors_read(runs: dict[str, Run]) -> None:
    for side, run in runs.items():
        found = samples(run.metrics)
        assert [name for name in COLLECTOR_SAMPLES if name not in found] == [], side


def test_cache_counters_agree_after_the_same_traffic(runs: dict[str, Run]) -> None:
    real, simulated = runs["real"].metrics, runs["simulator"].metrics
    assert {name: total(simulated, name) for name in COUNTERS} == {
        name: total(real, name) for name in COUNTERS
    }


def test_each_requests_span_has_the_same_attribute_keys_on_both(runs: dict[str, Run]) -> None:
    # Including the keys vLLM sets only when truthy (top_p, temperature): the simulator mirrors that rule.
    real, simulated = runs["real"].span_keys, runs["simulator"].span_keys
    assert len(real) == len(simulated)
    assert [sorted(r ^ s) for r, s in zip(real, simulated, strict=True) if r != s] == []
