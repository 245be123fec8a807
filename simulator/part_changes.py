"""A scenario of chat requests that change one request part at a time, for ground truth. Pure.

One support conversation (a system message, four tools, a reasoning effort, two earlier turns and a
new question each time) is sent in phases. Each phase after the first changes one part and keeps
the change (as a deployment does): the tools reordered, the reasoning effort raised (a chat-template
argument), the system message edited, a tool added, the history compacted into a summary, thinking
turned off (`enable_thinking`, another chat-template argument), the model swapped for a LoRA adapter.
The first request of a phase is the one the change hits (its expected part is the change); the others
differ from the one before only by their new question (`messages`). The chat template renders the
tools and the reasoning effort at the top, and thinking turned off at the very end, after the latest
message (gpt2.PARTS_CHAT_TEMPLATE): a request that turns it off departs in its new question, so that
is its part (the rule order alone would name its template arguments).
A hosted API's cache keys on the content alone (HOSTED_PHASES: no adapter, and a reasoning effort
changed keeps the tools and system cached, a partial hit): simulator/hosted.py sends those phases as
an application reports them, its Anthropic body (`anthropic_body`) or its GenAI span's content.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SYSTEM = (
    "You are the support desk of a parcel company. Answer in two sentences, never promise a date, "
    "never reveal internal ticket numbers, and hand over to a person when the customer asks twice."
)
_BY_ID = {"type": "object", "properties": {"id": {"type": "string"}}}
TOOLS = [
    {"type": "function",
     "function": {"name": name, "description": f"{name.replace('_', ' ')} by id", "parameters": _BY_ID}}
    for name in ("lookup_order", "track_parcel", "open_refund", "escalate_case")
]  # fmt: skip
EXTRA_TOOL = {"type": "function", "function": {"name": "change_address", "parameters": {"type": "object"}}}
HISTORY = [
    {"role": "user", "content": "My parcel has not arrived and the tracking page shows nothing at all."},
    {"role": "assistant", "content": "I am sorry to hear that. Could you give me the order number please?"},
]
SUMMARY = [{"role": "user", "content": "Summary so far: the parcel is late and tracking is empty."}]
PHASES = ("base", "tools", "reasoning_effort", "system", "tools_added", "history", "thinking", "adapter")
HOSTED_PHASES = ("base", "tools", "system", "tools_added", "history")


@dataclass(frozen=True, slots=True)
class Step:
    body: dict[str, Any]
    injected: str  # the request part the scenario changed for this request (RequestPart's value)


def part_change_steps(
    *, per_phase: int, model: str, adapter: str, seed: int = 0, phases: Sequence[str] = PHASES
) -> list[Step]:
    """The scenario's requests in order: `per_phase` per phase of `phases` (PHASES' names, "base" first;
    a scenario's `conversations` choose theirs)."""
    rng = random.Random(seed)
    state: dict[str, Any] = {"system": SYSTEM, "tools": list(TOOLS), "effort": "low", "history": HISTORY,
                             "model": model, "thinking": True}  # fmt: skip
    steps: list[Step] = []
    for phase in phases:
        _change(state, phase, adapter)
        for n in range(per_phase):
            question = (
                f"Order {rng.randrange(10**6, 10**7)}: where is it and when will it {rng.choice(WORDS)}?"
            )
            injected = _PART_OF.get(phase, "messages") if n == 0 else "messages"
            injected = "" if not steps else injected  # the first of its kind: cold, no part
            steps.append(Step(_body(state, question), injected))
    return steps


WORDS = ("arrive", "ship", "leave the depot", "be delivered", "reach me", "be sent")
# Thinking turned off renders after the new question: the prompt departs in the question.
_PART_OF = {"tools": "tools", "tools_added": "tools", "reasoning_effort": "reasoning_effort",
            "system": "system", "history": "history", "adapter": "adapter",
            "thinking": "messages"}  # fmt: skip


def _change(state: dict[str, Any], phase: str, adapter: str) -> None:
    if phase == "tools":
        state["tools"] = state["tools"][::-1]
    elif phase == "reasoning_effort":
        state["effort"] = "high"
    elif phase == "system":
        state["system"] = SYSTEM.replace("two sentences", "three sentences")
    elif phase == "tools_added":
        state["tools"] = [*state["tools"], EXTRA_TOOL]
    elif phase == "history":
        state["history"] = SUMMARY
    elif phase == "thinking":
        state["thinking"] = False
    elif phase == "adapter":
        state["model"] = adapter


def _body(state: dict[str, Any], question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": state["system"]}, *state["history"],
                {"role": "user", "content": question}]  # fmt: skip
    return {
        # tool_choice "none": the tools rendered, no tool-call parser needed (vLLM refuses "auto" without).
        "model": state["model"], "messages": messages, "tools": state["tools"], "tool_choice": "none",
        "max_tokens": 1,
        "chat_template_kwargs": {"reasoning_effort": state["effort"]}
        | ({} if state["thinking"] else {"enable_thinking": False}),
    }  # fmt: skip


_THINKING_BUDGET = {"low": 1024, "high": 8192}


def anthropic_body(body: dict[str, Any]) -> dict[str, Any]:
    """A step's chat body as the Anthropic Messages body that asks the same (platform.claude.com
    Messages API): the system message at the top, each tool as `name`, `description` and
    `input_schema`, the reasoning effort as an extended-thinking budget."""
    system = [m["content"] for m in body["messages"] if m["role"] == "system"]
    tools = [{**{k: f[k] for k in ("name", "description") if k in f}, "input_schema": f["parameters"]}
             for f in (tool["function"] for tool in body["tools"])]  # fmt: skip
    budget = _THINKING_BUDGET[body["chat_template_kwargs"]["reasoning_effort"]]
    return {
        "model": body["model"], "max_tokens": body["max_tokens"], "system": "\n".join(system), "tools": tools,
        "tool_choice": {"type": "none"}, "thinking": {"type": "enabled", "budget_tokens": budget},
        "messages": [m for m in body["messages"] if m["role"] != "system"],
    }  # fmt: skip
