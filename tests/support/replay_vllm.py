"""Ground truth for the replay from the real vLLM CPU server: a trace of prompts with shared prefixes,
sent one at a time, and what the server reported it reused.

`truth_prompts` makes the traffic: TEMPLATES system texts of about six blocks of 32 tokens each,
and a question after them, some shared (a repeated question reuses a block more), drawn at random;
about eight blocks a prompt, so a cache of 24 blocks (23 usable) holds under three prompts and one
of 40 under five: the five templates evict each other at both. `send_trace` sends them to a server
with max_tokens 1 (no decode step: every block stored is a prompt block) and `return_token_ids`, and
returns the trace: the server's prompt token ids, its block size, the engine's block hashes
(sha256_cbor, as app.domain.blockhash computes them and the KV events report them) and its cached
tokens.
"""

from __future__ import annotations

import json
import random
import urllib.request
from typing import Any

from app.domain.blockhash import block_hash_chain
from app.domain.replay.run import ServerShape, Setup, replay
from app.domain.replay.trace import TraceRequest
from tests.support.vllm_cpu import VLLMServer

TEMPLATES = 5
REQUESTS = 40
WORDS = (
    "router", "firmware", "policy", "ticket", "manual", "section", "customer", "invoice", "refund",
    "plan", "network", "signal", "cable", "light", "reset", "update", "answer", "escalate", "summary",
    "device", "channel", "wireless", "password", "account",
)  # fmt: skip


def truth_prompts(*, seed: int = 0, count: int = REQUESTS) -> list[tuple[str, str]]:
    """`count` (template, prompt text) pairs, the same for the same seed."""
    rng = random.Random(seed)
    systems = [
        f"System {n}: " + " ".join(rng.choice(WORDS) for _ in range(200)) + "\n" for n in range(TEMPLATES)
    ]
    questions = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(10, 60))) for _ in range(12)]
    prompts = []
    for _ in range(count):
        template = rng.randrange(TEMPLATES)
        prompts.append((f"t{template}", f"{systems[template]}Question: {rng.choice(questions)}\nAnswer:"))
    return prompts


def send_trace(server: VLLMServer, prompts: list[tuple[str, str]], *, name: str) -> tuple[TraceRequest, ...]:
    """Send `prompts` one at a time; the trace of what the server (called `name`) saw and reused."""
    trace = []
    for index, (template, text) in enumerate(prompts):
        body = {
            "model": server.model,
            "prompt": text,
            "max_tokens": 1,
            "temperature": 0,
            "return_token_ids": True,
        }
        answer = _post(f"{server.base_url}/v1/completions", body)
        ids = tuple(answer["choices"][0]["prompt_token_ids"])
        usage = answer["usage"]
        hashes = block_hash_chain(ids, server.block_size)
        trace.append(
            TraceRequest(
                request_id=f"r{index}",
                arrived=float(index),
                prompt_tokens=usage["prompt_tokens"],
                server=name,
                template=template,
                block_size=server.block_size,
                block_hashes=tuple(h.wire for h in hashes),
                token_ids=ids,
                cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            )
        )
    return tuple(trace)


def hit_rate(trace: tuple[TraceRequest, ...]) -> float:
    """What the server reused of the trace, in points."""
    return 100 * sum(r.cached_tokens or 0 for r in trace) / sum(r.prompt_tokens for r in trace)


def predicted(
    trace: tuple[TraceRequest, ...], *, num_blocks: int, block_size: int
) -> tuple[float, list[int]]:
    """The replay's hit rate in points for `trace` on one server of `num_blocks`, and its reuse
    per request."""
    shape = ServerShape(trace[0].server, num_blocks)
    result = replay(trace, Setup((shape,), block_size))
    assert result.hit_rate is not None
    return 100 * result.hit_rate, result.reused


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)
