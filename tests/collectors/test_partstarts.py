"""The renderings the gateway has /tokenize make to learn where a chat request's parts start: one part
taken away each, the messages cut before the history and before the latest turn, and the top-level
reasoning effort passed to the template as vLLM 0.32's chat completion passes it."""

from typing import Any

from collectors.partstarts import FULL, part_starts, renderings
from tests.collectors.test_parts import BODY

SYSTEM, HISTORY, ASSISTANT, LATEST = BODY["messages"]


def test_each_part_the_request_has_is_taken_away_once_and_the_messages_cut_before_their_turns() -> None:
    found = renderings({**BODY, "tool_choice": "none", "response_format": {"type": "text"}, "max_tokens": 1})
    assert sorted(found) == sorted(
        [FULL, "tools", "reasoning_effort", "template_kwargs", "system", "history", "messages"]
    )
    full = found[FULL]
    assert full == {k: BODY[k] for k in ("model", "messages", "tools", "chat_template_kwargs")}
    assert "tools" not in found["tools"]
    assert found["reasoning_effort"]["chat_template_kwargs"] == {"enable_thinking": True}
    assert found["template_kwargs"]["chat_template_kwargs"] == {"reasoning_effort": "low"}
    assert found["system"]["messages"] == [HISTORY, ASSISTANT, LATEST]
    cut = {"add_generation_prompt": False, "continue_final_message": False}
    assert found["history"] == {**full, "messages": [SYSTEM], **cut}
    assert found["messages"] == {**full, "messages": [SYSTEM, HISTORY, ASSISTANT], **cut}


def test_a_top_level_reasoning_effort_reaches_the_template_over_the_clients_with_enable_thinking() -> None:
    body: dict[str, Any] = {"messages": [LATEST], "reasoning_effort": "none",
                            "chat_template_kwargs": {"reasoning_effort": "low"}}  # fmt: skip
    found = renderings(body)
    assert found[FULL]["chat_template_kwargs"] == {"reasoning_effort": "none", "enable_thinking": False}
    assert "chat_template_kwargs" not in found["reasoning_effort"]
    assert sorted(found) == [FULL, "reasoning_effort"]  # no cut leaves the latest turn with nothing before


def test_a_part_starts_at_the_first_token_its_rendering_without_it_does_not_share() -> None:
    prompt = [1, 2, 3, 4, 5]
    assert part_starts(prompt, {FULL: prompt, "tools": [1, 9], "messages": [1, 2, 3], "system": []}) == {
        "tools": 1, "messages": 3, "system": 0,
    }  # fmt: skip
