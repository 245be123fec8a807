"""Hosted-API traffic with each hosted miss cause injected: request records as an application would
report them (a provider's usage shape, its prompt's content-block digests and cache markers), each
with the cause it was built to show. Pure; the ground truth of app/domain/hosted.py's diagnosis
(tests/traffic/test_hosted_causes.py sends them through the real REST and OTLP ingest).

Every session has a tenant of its own (a provider's cache is never shared across tenants), so the
causes do not mix. What each session does, in virtual seconds from `start`:
- `cold` then `hit`: a prefix sent for the first time, then again within its TTL and read;
- `below_minimum`: prompts shorter than the provider's minimum for the model;
- `ttl_lapsed`: the same prefix again after longer than the provider's TTL (5 minutes);
- `ttl_1h`: a prefix cached with Anthropic's 1-hour TTL, read after 10 minutes, then sent 8 to 10
  minutes after that through a gateway that strips the marker: `marker_absent`, not lapsed (a
  5-minute entry would have been);
- `ttl_1h_lapsed` (sessions longer than an hour, `hour_long`): Claude on Bedrock cached with a 1-hour
  TTL (`cacheDetails`), sent again after more than an hour: `ttl_lapsed`;
- `marker_absent`: Claude on Bedrock through a gateway that strips `cachePoint`: nothing is written
  or read, however often the prefix repeats;
- `cache_key_changed`: OpenAI, the same prefix under a new `prompt_cache_key`;
- `beyond_lookback`: an agent's conversation grows by more than 20 content blocks between two calls
  whose marker is on the last block;
- `prompt_changed`: a block before the marker edited;
- `gateway_cache`: answered by the gateway's semantic cache (Portkey's `x-portkey-cache-status`).

`part_change_traffic` sends the part-change scenario (simulator/part_changes.py) the same way, each
record with the request body it sent: Claude's Anthropic body over REST, GPT's chat body as the
content of its GenAI span; what it injected is the part changed.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from simulator.part_changes import HOSTED_PHASES, anthropic_body, part_change_steps
from simulator.scenario_side import Hosted

HIT = "hit"  # the expected outcome of a request served from the cache: no cause but its new content


@dataclass(frozen=True, slots=True)
class HostedRequest:
    """One record to send, and what it was built to show."""

    injected: str  # a Cause value, HIT, or "gateway_cache"; part_change_traffic: a part (RequestPart's value)
    record: dict[str, Any]  # a REST ingest record (app/api/schemas.py RequestRecordIn)
    over_otlp: bool = False  # sent as an OTLP GenAI span instead


@dataclass(slots=True)
class _Session:
    provider: str
    model: str
    tenant: str
    start: datetime
    rng: random.Random
    id_prefix: str = ""
    made: list[HostedRequest] = field(default_factory=list)

    def digests(self, blocks: int, *, salt: str = "") -> list[str]:
        return [
            hashlib.sha256(f"{self.tenant}/{salt if i else ''}{i}".encode()).hexdigest()
            for i in range(blocks)
        ]

    def send(self, injected: str, at: float, usage: dict[str, Any], **fields: Any) -> None:
        record = {
            "server": f"{self.provider}-api", "request_id": f"{self.id_prefix}{self.tenant}-{len(self.made)}",
            "arrived_at": (self.start + timedelta(seconds=at)).isoformat(), "model": self.model,
            "tenant": self.tenant, "provider": self.provider, "usage": usage, **fields,
        }  # fmt: skip
        self.made.append(HostedRequest(injected, record, over_otlp=self.provider == "openai"))


def _anthropic(uncached: int, read: int, written: int, ttl: str = "5m") -> dict[str, Any]:
    """The Messages API's usage: the writes split by TTL in `cache_creation` (platform.claude.com
    prompt caching)."""
    split = {"ephemeral_5m_input_tokens": written if ttl == "5m" else 0,
             "ephemeral_1h_input_tokens": written if ttl == "1h" else 0}  # fmt: skip
    return {"input_tokens": uncached, "cache_read_input_tokens": read, "cache_creation_input_tokens": written,
            "cache_creation": split, "output_tokens": 40}  # fmt: skip


def _bedrock(uncached: int, read: int, written: int, ttl: str = "5m") -> dict[str, Any]:
    """Converse's TokenUsage: `cacheDetails` lists the writes by TTL, empty without one (Bedrock API
    reference, TokenUsage and CacheDetail)."""
    details = [{"ttl": ttl, "inputTokens": written}] if written else []
    return {"inputTokens": uncached, "cacheReadInputTokens": read, "cacheWriteInputTokens": written,
            "cacheDetails": details, "outputTokens": 40}  # fmt: skip


def _openai(prompt: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _warm(s: _Session) -> None:
    blocks = s.digests(5)
    s.send("cold", 0, _anthropic(300, 0, 5000), prompt_blocks=blocks, cache_breakpoints=[3])
    for i in range(1, 4):
        tail = [*blocks[:4], f"{blocks[4]}-{i}"]
        s.send(HIT, 60 * i, _anthropic(300, 5000, 0), prompt_blocks=tail, cache_breakpoints=[3])


def _below_minimum(s: _Session) -> None:
    for i in range(3):
        s.send("below_minimum", 30 * i, _anthropic(3000 + s.rng.randrange(1000), 0, 0),
               prompt_blocks=s.digests(3), cache_breakpoints=[1])  # fmt: skip


def _ttl_lapsed(s: _Session) -> None:
    blocks = s.digests(4)
    s.send("cold", 0, _anthropic(200, 0, 4000), prompt_blocks=blocks, cache_breakpoints=[2])
    s.send("ttl_lapsed", 301 + s.rng.randrange(600), _anthropic(200, 0, 4000), prompt_blocks=blocks,
           cache_breakpoints=[2])  # fmt: skip


def _ttl_1h(s: _Session) -> None:
    blocks = s.digests(4)
    s.send("cold", 0, _anthropic(200, 0, 4000, ttl="1h"), prompt_blocks=blocks, cache_breakpoints=[2])
    read_at = 600 + s.rng.randrange(120)
    s.send(HIT, read_at, _anthropic(200, 4000, 0), prompt_blocks=blocks, cache_breakpoints=[2])
    stripped_at = read_at + 480 + s.rng.randrange(120)  # 8 to 10 minutes after the read
    s.send("marker_absent", stripped_at, _anthropic(4200, 0, 0), prompt_blocks=blocks, cache_breakpoints=[2])


def _ttl_1h_lapsed(s: _Session) -> None:
    blocks = s.digests(4)
    s.send("cold", 0, _bedrock(100, 0, 5000, ttl="1h"), prompt_blocks=blocks, cache_breakpoints=[2])
    s.send("ttl_lapsed", 3601 + s.rng.randrange(600), _bedrock(100, 0, 5000, ttl="1h"), prompt_blocks=blocks,
           cache_breakpoints=[2])  # fmt: skip


def _marker_absent(s: _Session) -> None:
    blocks = s.digests(4)
    s.send("cold", 0, _bedrock(6000, 0, 0), prompt_blocks=blocks, cache_breakpoints=[2])
    for i in range(1, 4):
        s.send("marker_absent", 20 * i, _bedrock(6000, 0, 0), prompt_blocks=blocks, cache_breakpoints=[2])


def _cache_key_changed(s: _Session) -> None:
    blocks = s.digests(3)
    s.send("cold", 0, _openai(5000, 0), prompt_blocks=blocks, prompt_cache_key="user-1")
    s.send(HIT, 30, _openai(5000, 4864), prompt_blocks=blocks, prompt_cache_key="user-1")
    s.send("cache_key_changed", 60, _openai(5000, 0), prompt_blocks=blocks, prompt_cache_key="user-2")


def _beyond_lookback(s: _Session) -> None:
    early, grown = s.digests(6), s.digests(6 + 21 + s.rng.randrange(10))
    s.send("cold", 0, _anthropic(50, 0, 8000), prompt_blocks=early, cache_breakpoints=[5])
    s.send("beyond_lookback", 60, _anthropic(50, 0, 20000), prompt_blocks=grown,
           cache_breakpoints=[len(grown) - 1])  # fmt: skip


def _prompt_changed(s: _Session) -> None:
    blocks = s.digests(4)
    s.send("cold", 0, _bedrock(100, 0, 5000), prompt_blocks=blocks, cache_breakpoints=[2])
    edited = [blocks[0], s.digests(4, salt="v2")[1], *blocks[2:]]
    s.send("prompt_changed", 60, _bedrock(100, 0, 5000), prompt_blocks=edited, cache_breakpoints=[2])


def _gateway_cache(s: _Session) -> None:
    blocks = s.digests(3)
    s.send("cold", 0, _openai(3000, 0), prompt_blocks=blocks)
    for i in range(1, 3):
        s.send("gateway_cache", 10 * i, _openai(3000, 0), prompt_blocks=blocks,
               response_headers={"x-portkey-cache-status": "SEMANTIC HIT"})  # fmt: skip


_CLAUDE_ON_BEDROCK = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
_KINDS: dict[str, tuple[str, str, Callable[[_Session], None]]] = {
    "warm": ("anthropic", "claude-sonnet-4-5", _warm),
    "below_minimum": ("anthropic", "claude-opus-4-6", _below_minimum),
    "ttl_lapsed": ("anthropic", "claude-sonnet-4-5", _ttl_lapsed),
    "ttl_1h": ("anthropic", "claude-sonnet-4-5", _ttl_1h),
    "marker_absent": ("bedrock", _CLAUDE_ON_BEDROCK, _marker_absent),
    "cache_key_changed": ("openai", "gpt-5.6", _cache_key_changed),
    "beyond_lookback": ("anthropic", "claude-sonnet-4-5", _beyond_lookback),
    "prompt_changed": ("bedrock", _CLAUDE_ON_BEDROCK, _prompt_changed),
    "gateway_cache": ("openai", "gpt-5.6", _gateway_cache),
}
# Sessions that last longer than an hour: left out of a shorter run (the demo's 25 minutes).
_HOUR_LONG: dict[str, tuple[str, str, Callable[[_Session], None]]] = {
    "ttl_1h_lapsed": ("bedrock", _CLAUDE_ON_BEDROCK, _ttl_1h_lapsed),
}


def hosted_traffic(
    *, start: datetime, sessions: int = 4, seed: int = 7, id_prefix: str = "", hour_long: bool = False
) -> list[HostedRequest]:
    """`sessions` sessions of each kind (with `hour_long`, also those lasting more than an hour),
    their requests in time order; request ids begin with `id_prefix` (a demo's rounds send the same
    sessions again under new ids)."""
    rng = random.Random(seed)
    kinds = {**_KINDS, **_HOUR_LONG} if hour_long else _KINDS
    made: list[HostedRequest] = []
    for n in range(sessions):
        for kind in kinds:
            provider, model, play = kinds[kind]
            session = _Session(
                provider, model, tenant=f"{kind}-{n}", start=start, rng=rng, id_prefix=id_prefix
            )
            play(session)
            made += session.made
    return sorted(made, key=lambda request: request.record["arrived_at"])


_QUESTION_TOKENS = 300  # each content block's tokens, near enough: the latest question is one


def demo_traffic(hosted: Hosted, *, start: datetime, id_prefix: str = "") -> list[HostedRequest]:
    """A scenario's `hosted` usage from its start: the sessions of each kind, and the part-change
    scenario where it asks for it (its records send their body alone: Prefixscope digests the
    content blocks), in time order."""
    at = start + timedelta(seconds=hosted.start)
    made = hosted_traffic(start=at, sessions=hosted.sessions, id_prefix=id_prefix)
    if hosted.part_changes:
        made += part_change_traffic(start=at, id_prefix=id_prefix, body_only=True)
    return sorted(made, key=lambda request: request.record["arrived_at"])


def part_change_traffic(
    *, start: datetime, per_phase: int = 3, seed: int = 0, id_prefix: str = "", body_only: bool = False
) -> list[HostedRequest]:
    """The hosted part-change scenario in time order, one request every 30 s per provider: `injected`
    is the part its phase changed ("" the first request, "messages" one that only asks anew). The
    prompt's content blocks are its tools, system message and messages, in the order the providers'
    caches key on; Claude's marker is on the block before the latest question. A change misses the
    cache (nothing read; Claude writes the prefix to its marker again), a new question reads it.
    `body_only`: the records send their body and not its blocks' digests (Claude's marker is then
    the body's `cache_control`), as an application that reports what it sent and computes nothing."""
    made: list[HostedRequest] = []
    for provider, model in (("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-5.6")):
        rng, tenant = random.Random(seed), f"parts-{provider}"
        session = _Session(provider, model, tenant=tenant, start=start, rng=rng, id_prefix=id_prefix)
        steps = part_change_steps(
            per_phase=per_phase, model=model, adapter="", seed=seed, phases=HOSTED_PHASES
        )
        for n, step in enumerate(steps):
            blocks = _content_blocks(step.body)
            prompt, prefix = len(blocks) * _QUESTION_TOKENS, (len(blocks) - 1) * _QUESTION_TOKENS
            hit = step.injected == "messages"
            fields: dict[str, Any] = {} if body_only else {"prompt_blocks": blocks}
            if provider == "anthropic":
                usage = _anthropic(_QUESTION_TOKENS, prefix if hit else 0, 0 if hit else prefix)
                body = anthropic_body(step.body)
                if body_only:
                    fields["request_body"] = _marked(body, len(blocks) - 2)
                else:
                    fields |= {"request_body": body, "cache_breakpoints": [len(blocks) - 2]}
            else:
                usage, fields["request_body"] = _openai(prompt, prefix if hit else 0), step.body
            session.send(step.injected, 30 * n, usage, template="support", **fields)
        made += session.made
    return sorted(made, key=lambda request: request.record["arrived_at"])


def _marked(body: dict[str, Any], index: int) -> dict[str, Any]:
    """An Anthropic body with Claude's cache marker on its content block `index` (tools, system,
    messages: one block each), the string there written as the text block it stands for."""
    tools, messages = list(body["tools"]), list(body["messages"])
    marker = {"cache_control": {"type": "ephemeral"}}
    if index < len(tools):
        tools[index] = tools[index] | marker
        return body | {"tools": tools}
    if index == len(tools):
        return body | {"system": [{"type": "text", "text": body["system"]} | marker]}
    at = index - len(tools) - 1
    messages[at] = messages[at] | {"content": [{"type": "text", "text": messages[at]["content"]} | marker]}
    return body | {"messages": messages}


def _content_blocks(body: dict[str, Any]) -> list[str]:
    """A digest of each content block (tools, system, messages: the order a cache keys on), as an
    application computes them (sha256 of the block's JSON)."""
    system = [m for m in body["messages"] if m["role"] == "system"]
    blocks = [*body["tools"], *system, *(m for m in body["messages"] if m["role"] != "system")]
    return [hashlib.sha256(json.dumps(block, sort_keys=True).encode()).hexdigest() for block in blocks]
