"""Which part of a request changed: the one whose span holds the departure where the parts' starts
are known, else by the rule order: model or adapter, tools, system, parameters, history, latest
messages."""

from dataclasses import replace

import pytest

from app.domain.misses import Cause, Diagnosis, Funnel, Loss, RequestPart
from app.domain.requestparts import (
    PartChange,
    PartDetail,
    Parts,
    RecentParts,
    changed_part,
    own_turn,
    part_at,
)  # fmt: skip

BEFORE = Parts(
    model="tiny", system="s1", tools=("t1", "t2"), tools_sent="sent", reasoning_effort="low",
    template_kwargs={"enable_thinking": "yes"}, messages=("u1", "a1", "u2"), latest=1,
)  # fmt: skip


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (replace(BEFORE, model="support-lora", adapter=True), PartChange(RequestPart.ADAPTER)),
        (replace(BEFORE, model="other"), PartChange(RequestPart.MODEL)),
        (replace(BEFORE, tools=("t1", "t2", "t3")), PartChange(RequestPart.TOOLS, PartDetail.ADDED)),
        (replace(BEFORE, tools=("t1",)), PartChange(RequestPart.TOOLS, PartDetail.REMOVED)),
        (replace(BEFORE, tools=("t1", "t9")), PartChange(RequestPart.TOOLS, PartDetail.EDITED)),
        (replace(BEFORE, tools=("t2", "t1")), PartChange(RequestPart.TOOLS, PartDetail.REORDERED)),
        (replace(BEFORE, tools_sent="other"), PartChange(RequestPart.TOOLS, PartDetail.RESERIALIZED)),
        (replace(BEFORE, system="s2"), PartChange(RequestPart.SYSTEM)),
        (replace(BEFORE, tool_choice="auto"), PartChange(RequestPart.TOOL_CHOICE)),
        (replace(BEFORE, response_format="json"), PartChange(RequestPart.RESPONSE_FORMAT)),
        (replace(BEFORE, reasoning_effort="high"), PartChange(RequestPart.REASONING_EFFORT)),
        (replace(BEFORE, template_kwargs={"enable_thinking": "no"}),
         PartChange(RequestPart.TEMPLATE_KWARGS, kwarg="enable_thinking")),
        (replace(BEFORE, messages=("summary", "u3"), latest=2), PartChange(RequestPart.HISTORY)),
        (replace(BEFORE, messages=("u1", "a1-edited", "u2"), latest=1), PartChange(RequestPart.HISTORY)),
        (replace(BEFORE, messages=("u1", "a1", "u2", "a2", "u3")), PartChange(RequestPart.MESSAGES)),
        (replace(BEFORE, messages=("u1", "a1", "u2-edited"), latest=1), PartChange(RequestPart.MESSAGES)),
        (BEFORE, None),
    ],
)  # fmt: skip
def test_the_first_changed_part_in_rule_order_is_named(after: Parts, expected: PartChange | None) -> None:
    assert changed_part(after, BEFORE) == expected


def test_the_tools_are_named_before_the_latest_messages_that_always_change() -> None:
    after = replace(BEFORE, tools=("t2", "t1"), messages=("u1", "a1", "u2", "a2", "u3"))
    assert changed_part(after, BEFORE) == PartChange(RequestPart.TOOLS, PartDetail.REORDERED)


def test_parts_read_back_from_their_stored_json_with_defaults_left_out() -> None:
    stored = {"system": "s1", "tools": ["t1"], "latest": 1, "starts": {"system": 3}}
    found = Parts.from_json(stored, model="tiny", adapter=False)
    assert found == Parts(model="tiny", system="s1", tools=("t1",), latest=1, starts={"system": 3})


# A prompt as PARTS_CHAT_TEMPLATE renders it, with Qwen3's `enable_thinking` rendered at its end:
# tools at 0, reasoning effort at 2 (the same header), system 40, history 60, latest 90, and the
# template argument at 120, after the latest message.
STARTS = {
    "tools": 0,
    "reasoning_effort": 2,
    "system": 40,
    "history": 60,
    "messages": 90,
    "template_kwargs": 120,
}
NEXT_TURN = ("u1", "a1", "u2", "a2", "u3")


@pytest.mark.parametrize(
    ("after", "departs", "expected"),
    [
        # A template argument rendered low and the latest message: the departure is in the message.
        (replace(BEFORE, template_kwargs={"enable_thinking": "no"}, messages=NEXT_TURN), range(95, 96),
         PartChange(RequestPart.MESSAGES)),
        # ... and, known to its block only, the argument starting past that block is not a candidate.
        (replace(BEFORE, template_kwargs={"enable_thinking": "no"}, messages=NEXT_TURN), range(80, 96),
         PartChange(RequestPart.MESSAGES)),
        # One rendered at the top (the reasoning effort) departs there, before the message.
        (replace(BEFORE, reasoning_effort="high", messages=NEXT_TURN), range(5, 6),
         PartChange(RequestPart.REASONING_EFFORT)),
        # The history rewritten and a new question: the departure in the history names it.
        (replace(BEFORE, messages=("summary", "u3"), latest=1), range(61, 62),
         PartChange(RequestPart.HISTORY)),
        # A block holding the start of the latest message as well: both remain, the rule order names one.
        (replace(BEFORE, messages=("summary", "u3"), latest=1), range(80, 96),
         PartChange(RequestPart.HISTORY)),
        # A changed part whose start is not known stays a candidate.
        (replace(BEFORE, tool_choice="auto", messages=NEXT_TURN), range(95, 96),
         PartChange(RequestPart.TOOL_CHOICE)),
        # The model changes every block, wherever the departure.
        (replace(BEFORE, model="other", messages=NEXT_TURN), range(95, 96), PartChange(RequestPart.MODEL)),
    ],
)  # fmt: skip
def test_the_changed_part_whose_span_holds_the_departure_is_named(
    after: Parts, departs: range, expected: PartChange
) -> None:
    assert changed_part(replace(after, starts=STARTS), BEFORE, departs) == expected


def test_without_starts_the_rule_order_names_a_part_rendered_after_the_departure() -> None:
    after = replace(BEFORE, template_kwargs={"enable_thinking": "no"}, messages=NEXT_TURN)
    assert changed_part(after, BEFORE, range(95, 96)) == PartChange(
        RequestPart.TEMPLATE_KWARGS, kwarg="enable_thinking"
    )


@pytest.mark.parametrize(
    ("position", "expected"),
    [(0, RequestPart.TOOLS), (1, RequestPart.TOOLS), (2, RequestPart.REASONING_EFFORT),
     (59, RequestPart.SYSTEM), (90, RequestPart.MESSAGES), (500, RequestPart.TEMPLATE_KWARGS)],
)  # fmt: skip
def test_a_token_lies_in_the_part_starting_last_at_or_before_it(position: int, expected: RequestPart) -> None:
    assert part_at(STARTS, position) == expected
    assert part_at({"messages": 90}, 89) is None


def test_the_compared_request_is_the_latest_holding_the_last_shared_block_and_memory_is_bounded() -> None:
    recent = RecentParts(limit=6)
    recent.remember([1, 2, 3], "a", BEFORE)
    recent.remember([1, 2, 4], "b", BEFORE)
    assert recent.compared([1, 2, 3, 9]) == ("a", BEFORE)  # shares three blocks with a, two with b
    assert recent.compared([1, 5]) == ("b", BEFORE)  # both share one: the latest
    assert recent.compared([7]) == ("b", BEFORE)  # none shares its first: the latest of all
    recent.remember([10, 11, 12], "c", BEFORE)
    assert recent.compared([1, 2, 3]) == ("c", BEFORE)  # a's blocks were the oldest, forgotten first


def _changed(part: RequestPart | None, losses: list[Loss]) -> Diagnosis:
    funnel = Funnel(prompt_tokens=112, seen_before=32, resident_anywhere=32, resident_here=32, reused=0)
    return Diagnosis(Cause.PROMPT_CHANGED, 40, tuple(losses), funnel, False, changed_part=part)


def test_a_change_of_the_latest_messages_alone_is_the_requests_own_new_content() -> None:
    evicted, changed = Loss(Cause.EVICTED, 0, 32), Loss(Cause.PROMPT_CHANGED, 32, 64)
    below = Loss(Cause.BELOW_BLOCK, 96, 16)
    found = own_turn(_changed(RequestPart.MESSAGES, [evicted, changed, below]))
    assert found.losses == (evicted, Loss(Cause.NEW_CONTENT, 32, 64), below)
    assert (found.cause, found.changed_part, found.diverged_at) == (Cause.EVICTED, None, None)
    alone = own_turn(_changed(RequestPart.MESSAGES, [changed]))
    assert (alone.cause, alone.losses) == (Cause.NEW_CONTENT, (Loss(Cause.NEW_CONTENT, 32, 64),))


@pytest.mark.parametrize("part", [RequestPart.HISTORY, RequestPart.SYSTEM, RequestPart.TOOLS, None])
def test_a_change_of_any_other_part_stays_a_prompt_change(part: RequestPart | None) -> None:
    diagnosis = _changed(part, [Loss(Cause.PROMPT_CHANGED, 32, 64)])
    assert own_turn(diagnosis) is diagnosis
