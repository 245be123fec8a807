"""The gateway's digests of a chat request's parts: equal for equal parts however serialized where
the template would render them the same, different where it would not, and never the text."""

from collections.abc import Mapping

import msgspec

from collectors.parts import PartDigests, part_digests

KEY = b"deployment secret"
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "refund", "parameters": {"properties": {}, "type": "object"}}},
]
BODY = {
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
