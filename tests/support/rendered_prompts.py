"""Prompts rendered the way the simulator renders them, tokenized with GPT-2 and hashed as vLLM does.

``planned_traffic`` runs the simulator's own planner over the demo scenario (its templates, their
variables, the faults of ``simulator.template_faults`` committed at a virtual second); ``variant_traffic``
renders one demo template per request from a text the test edits (whitespace drift, rotating examples),
with the variables the planner would give it. Hashes are unsalted: killers are looked for within one
compatibility record.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import cache
from itertools import islice

from app.domain.blockhash import signed_block_hashes
from app.domain.gpt2 import encode, render_chat
from app.domain.killers import Prompt
from simulator.planner import EPOCH, plan_requests
from simulator.scenario import Scenario, Template, TemplateChange, load_scenario, resolve_scenario
from simulator.template_faults import FAULT_MESSAGES, Fault, apply_fault
from simulator.template_rendering import request_variables, template_environment
from simulator.template_repo import Commit, template_versions

BLOCK_SIZE = 16  # the demo fleet's --block-size


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """One request's prompt text as the server sees it (a chat rendered with the model's template)."""

    template: str
    tenant: str
    text: str
    token_ids: tuple[int, ...]
    block_hashes: tuple[int, ...]

    def prompt(self, *, hash_only: bool = False) -> Prompt:
        """The request as ``find_killers`` takes it; ``hash_only`` drops the token ids."""
        return Prompt(
            block_hashes=self.block_hashes,
            token_ids=None if hash_only else self.token_ids,
            tenant=self.tenant,
        )


@cache
def demo_scenario() -> Scenario:
    """simulator/scenarios/demo.yaml."""
    return load_scenario(resolve_scenario("demo"))


def demo_template(name: str) -> Template:
    """One of the demo's templates (support, billing, agent) as first committed."""
    return next(t for t in demo_scenario().templates if t.name == name)


def rendered(template: str, tenant: str, text: str) -> RenderedPrompt:
    """Tokenize and hash one prompt text."""
    ids = encode(text)
    return RenderedPrompt(template, tenant, text, tuple(ids), tuple(signed_block_hashes(ids, BLOCK_SIZE)))


def planned_traffic(
    count: int,
    *,
    mix: Mapping[str, float],
    faults: Mapping[str, tuple[float, Fault]] | None = None,
    seed: int = 1,
) -> list[RenderedPrompt]:
    """The first ``count`` requests the simulator's planner sends for the demo templates in ``mix``
    (name -> weight), with each fault of ``faults`` (name -> (virtual second, fault)) committed."""
    demo = demo_scenario()
    templates = tuple(replace(t, weight=mix[t.name]) for t in demo.templates if t.name in mix)
    changes = tuple(
        TemplateChange(at, name, apply_fault(demo_template(name).text, fault), FAULT_MESSAGES[fault], fault)
        for name, (at, fault) in sorted((faults or {}).items(), key=lambda item: item[1][0])
    )
    scenario = replace(demo, templates=templates, timeline=changes, duration=1e6)
    commits = [
        Commit(sha=f"v{i}", template=v.template, time=v.at, message=v.message, path="", text=v.text)
        for i, v in enumerate(template_versions(scenario))
    ]
    return [
        _as_sent(request.template, request.tenant, request.body)
        for request in islice(plan_requests(scenario, commits, seed=seed), count)
    ]


def _as_sent(template: str, tenant: str, body: Mapping[str, object]) -> RenderedPrompt:
    messages = body.get("messages")
    if isinstance(messages, list):
        return rendered(template, tenant, render_chat(messages))
    return rendered(template, tenant, str(body["prompt"]))


def variant_traffic(
    name: str,
    count: int,
    *,
    text_for: Callable[[int, random.Random], str],
    tenant_for: Callable[[int], str] = lambda index: "acme",
    seed: int = 1,
) -> list[RenderedPrompt]:
    """``count`` requests of demo template ``name``, request i rendered from ``text_for(i, rng)`` (the
    template's text as edited for that request) with the variables the planner gives a request at
    virtual second i / 2: its time, request id, tenant, a question, and tools, schema and chunks in a
    fresh order. A chat template becomes the system message, the question the user message."""
    template = demo_template(name)
    environment = template_environment()
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        now = (EPOCH + timedelta(seconds=index / 2)).isoformat(timespec="milliseconds")
        tenant = tenant_for(index)
        text = text_for(index, rng)
        variables = request_variables(
            template, now=now, request_id=f"demo-{seed}-{index:06d}", tenant=tenant, rng=rng
        )
        body = environment.from_string(text).render(variables)
        if template.kind == "chat":
            body = render_chat(
                [{"role": "system", "content": body}, {"role": "user", "content": str(variables["question"])}]
            )
        prompts.append(rendered(name, tenant, body))
    return prompts


def interleave(*streams: Sequence[RenderedPrompt], seed: int = 7) -> list[RenderedPrompt]:
    """The streams merged into one arrival order, each keeping its own order."""
    rng = random.Random(seed)
    labels = [i for i, stream in enumerate(streams) for _ in stream]
    rng.shuffle(labels)
    cursors = [iter(stream) for stream in streams]
    return [next(cursors[label]) for label in labels]


def token_at(text: str, offset: int) -> int:
    """The index of the token that starts at character ``offset`` of ``text``.

    Raises AssertionError when no token starts there (the expected position would be off)."""
    before = encode(text[:offset])
    assert encode(text)[: len(before)] == before, "no token boundary at the offset"
    return len(before)
