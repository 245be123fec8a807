"""The gateway's digests of a chat request's parts: equal for equal parts however serialized where
the template would render them the same, different where it would not, and never the text."""

from collections.abc import Mapping
from typing import Any

import msgspec
import pytest

from collectors.parts import PartDigests, PartsError, body_digests, content_blocks, digest_key, part_digests

KEY = b"deployment secret"
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "refund", "parameters": {"properties": {}, "type": "object"}}},
]
BODY: dict[str, Any] = {
    "model": "tiny",
    "messages": [
        {"role": "system", "content": "You are the support desk."},
        {"role": "user", "content": "Where is my order?"},
        {"role": "assistant", "content": "Which order?"},
        {"role": "user", "content": "Order 42."},
    ],
    "tools": TOOLS,
    "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "low"},
}


def digests(body: Mapping[str, object], key: bytes = KEY) -> PartDigests:
    return part_digests(msgspec.json.decode(msgspec.json.encode(body)), key=key)


def test_each_part_has_its_digest_and_history_is_told_from_the_latest_turn() -> None:
    found = digests(BODY)
    assert found.system and len(found.tools) == 2 and found.tools_sent
    assert found.reasoning_effort and set(found.template_kwargs) == {"enable_thinking"}
    assert len(found.messages) == 3 and found.latest == 1  # after the last assistant message


def test_no_part_text_is_kept_and_another_key_gives_other_digests() -> None:
    stored = msgspec.json.encode(digests(BODY))
    for text in (b"support desk", b"order", b"lookup", b"low"):
        assert text not in stored.lower()
    assert digests(BODY, b"another secret").system != digests(BODY).system


def test_reordered_tools_keep_their_set_and_change_their_order() -> None:
    before, after = digests(BODY), digests(BODY | {"tools": TOOLS[::-1]})
    assert sorted(after.tools) == sorted(before.tools) and after.tools != before.tools


def test_a_schema_reserialized_keeps_its_tool_digest_and_changes_the_bytes_sent() -> None:
    swapped = [TOOLS[0], {"function": TOOLS[1]["function"], "type": "function"}]
    before, after = digests(BODY), digests(BODY | {"tools": swapped})
    assert after.tools == before.tools and after.tools_sent != before.tools_sent


def test_a_top_level_reasoning_effort_is_the_same_part_as_the_template_argument() -> None:
    top = BODY | {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "low"}
    assert digests(top).reasoning_effort == digests(BODY).reasoning_effort
    high = BODY | {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "high"}}
    assert digests(high).reasoning_effort != digests(BODY).reasoning_effort


def test_a_conversation_without_an_assistant_turn_is_all_latest() -> None:
    found = digests({"messages": [{"role": "user", "content": "hi"}]})
    assert found.latest == 1 and found.system == "" and found.tools == []


# The same request as an Anthropic Messages body (platform.claude.com Messages API): the system at
# the top, tools with `input_schema`, cache markers on blocks.
ANTHROPIC: dict[str, Any] = {
    "model": "tiny",
    "system": [{"type": "text", "text": "You are the support desk.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS],
    "messages": BODY["messages"][1:],
    "max_tokens": 100,
}
SYSTEM_AS_BLOCKS = {"role": "system", "content": [{"type": "text", "text": "You are the support desk."}]}


def anthropic(body: Mapping[str, object], key: bytes = KEY) -> PartDigests:
    return body_digests(msgspec.json.decode(msgspec.json.encode(body)), key=key)


def test_an_anthropic_body_gives_the_parts_of_the_chat_body_that_says_the_same() -> None:
    chat = digests(BODY | {"messages": [SYSTEM_AS_BLOCKS, *BODY["messages"][1:]], "chat_template_kwargs": {}})
    assert anthropic(ANTHROPIC) == chat  # the cache marker is no content
    plain = digests(BODY | {"chat_template_kwargs": {}})
    assert anthropic(ANTHROPIC | {"system": "You are the support desk."}) == plain


def test_a_body_s_content_blocks_come_tools_system_messages_with_their_markers() -> None:
    """What a hosted record that sent its body and no prompt_blocks gets: one block per tool,
    system block and message, in the providers' cache order; a marker is where it sits, not content."""
    blocks = content_blocks(ANTHROPIC, key=KEY, limit=100)
    assert len(blocks.digests) == 2 + 1 + 3 and blocks.marked == [2]
    unmarked = ANTHROPIC | {"system": "You are the support desk."}  # the string is the text block
    assert content_blocks(unmarked, key=KEY, limit=100) == (blocks.digests, [])
    asked_anew = ANTHROPIC | {
        "messages": [*ANTHROPIC["messages"][:-1], {"role": "user", "content": "Order 43."}]
    }
    anew = content_blocks(asked_anew, key=KEY, limit=100).digests
    assert anew[:-1] == blocks.digests[:-1] and anew[-1] != blocks.digests[-1]
    reordered = content_blocks(ANTHROPIC | {"tools": ANTHROPIC["tools"][::-1]}, key=KEY, limit=100).digests
    assert reordered[:2] == blocks.digests[1::-1] and reordered[2:] == blocks.digests[2:]
    assert content_blocks(ANTHROPIC, key=KEY, limit=4).digests == blocks.digests[:4]
    assert content_blocks(ANTHROPIC, key=b"another", limit=100).digests != blocks.digests
    assert "support desk" not in str(blocks)


def test_an_anthropic_body_tells_each_part_apart() -> None:
    before = anthropic(ANTHROPIC)
    assert anthropic(ANTHROPIC | {"system": "You are the sales desk."}).system != before.system
    reordered = anthropic(ANTHROPIC | {"tools": ANTHROPIC["tools"][::-1]})
    assert sorted(reordered.tools) == sorted(before.tools) and reordered.tools != before.tools
    thinking = anthropic(ANTHROPIC | {"thinking": {"type": "enabled", "budget_tokens": 2048}})
    assert thinking.reasoning_effort and thinking.messages == before.messages
    assert anthropic(ANTHROPIC | {"temperature": 0.2}) == before  # a sampling parameter renders nothing


def test_a_chat_body_reported_gives_the_gateways_digests() -> None:
    assert anthropic(BODY) == digests(BODY)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "request_body"),
        ({"model": "tiny"}, "request_body.messages"),
        ({"messages": [{"content": "no role"}]}, "request_body.messages"),
        ({"messages": ["hello"]}, "request_body.messages"),
        ({"messages": [], "tools": {"name": "x"}}, "request_body.tools"),
        ({"messages": [], "system": 7}, "request_body.system"),
        ({"messages": [], "chat_template_kwargs": "on"}, "request_body.chat_template_kwargs"),
    ],
)
def test_a_body_of_no_chat_shape_is_refused_naming_the_field_never_a_value(body: object, field: str) -> None:
    with pytest.raises(PartsError) as refused:
        body_digests(body, key=KEY)
    assert str(refused.value).startswith(f"{field}:") and "hello" not in str(refused.value)


def test_the_key_comes_from_the_deployments_secret() -> None:
    assert digest_key("one") == digest_key("one") != digest_key("two")
