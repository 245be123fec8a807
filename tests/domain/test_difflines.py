import difflib

import pytest

from app.domain.difflines import DiffLine, LineKind, diff_lines
from simulator.template_faults import apply_fault

K = LineKind
SUPPORT = """You are the support assistant of Acme.
Answer in the customer's language.
{% for tool in tools | sort(attribute='name') %}- {{ tool.name }}
{% endfor %}
Current time: {{ now }} | Request ID: {{ request_id }}
Customer: {{ customer.name }}
"""


def unified(before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), "a/support.j2", "b/support.j2"
    )
    return "".join(lines)


def kinds(diff: str) -> list[tuple[str, LineKind]]:
    return [(line.text, line.kind) for line in diff_lines(diff)]


def test_the_volatile_line_moved_to_the_top_is_marked_moved_at_both_ends() -> None:
    marked = diff_lines(unified(SUPPORT, apply_fault(SUPPORT, "volatile_top")))
    moved = [(i, line) for i, line in enumerate(marked) if line.kind in (K.MOVED_FROM, K.MOVED_TO)]

    assert [(line.text, line.kind) for _, line in moved] == [
        ("+Current time: {{ now }} | Request ID: {{ request_id }}", K.MOVED_TO),
        ("-Current time: {{ now }} | Request ID: {{ request_id }}", K.MOVED_FROM),
    ]
    (to, added), (origin, removed) = moved
    assert (added.partner, removed.partner) == (origin, to)
    assert not [line for line in marked if line.kind in (K.ADDED, K.REMOVED)]
    assert [line.kind for line in marked[:3]] == [K.FILE, K.FILE, K.HUNK]


def test_a_line_new_in_the_commit_is_added_and_one_dropped_is_removed() -> None:
    after = SUPPORT.replace("Answer in the customer's language.\n", "") + "Be brief.\n"
    assert ("+Be brief.", K.ADDED) in kinds(unified(SUPPORT, after))
    assert ("-Answer in the customer's language.", K.REMOVED) in kinds(unified(SUPPORT, after))


def test_a_line_reindented_where_it_stands_is_an_edit_not_a_move() -> None:
    after = SUPPORT.replace("Customer: {{ customer.name }}", "  Customer: {{ customer.name }}")
    assert [
        kind for _, kind in kinds(unified(SUPPORT, after)) if kind not in (K.FILE, K.HUNK, K.CONTEXT)
    ] == [
        K.REMOVED,
        K.ADDED,
    ]


def test_a_line_moved_and_reindented_is_still_moved() -> None:
    after = "    Customer: {{ customer.name }}\n" + SUPPORT.replace("Customer: {{ customer.name }}\n", "")
    assert ("+    Customer: {{ customer.name }}", K.MOVED_TO) in kinds(unified(SUPPORT, after))
    assert ("-Customer: {{ customer.name }}", K.MOVED_FROM) in kinds(unified(SUPPORT, after))


@pytest.mark.parametrize(
    ("diff", "expected"),
    [
        # Removed twice, added once elsewhere: one move, the other removal stays one.
        ("-x\n context\n-x\n other\n+x", [K.MOVED_FROM, K.CONTEXT, K.REMOVED, K.CONTEXT, K.MOVED_TO]),
        # Two lines swapped within one run of changes: both moved.
        ("-a\n-b\n+b\n+a", [K.MOVED_FROM, K.MOVED_FROM, K.MOVED_TO, K.MOVED_TO]),
        # Blank lines never count as moved.
        ("-\n context\n+", [K.REMOVED, K.CONTEXT, K.ADDED]),
        # Added before it is removed (moved up): matched all the same.
        ("+a\n context\n-a", [K.MOVED_TO, K.CONTEXT, K.MOVED_FROM]),
    ],
    ids=["twice-once", "swap", "blank", "added-first"],
)
def test_moves_pair_each_line_once(diff: str, expected: list[LineKind]) -> None:
    assert [line.kind for line in diff_lines(diff)] == expected


def test_no_diff_no_lines() -> None:
    assert diff_lines("") == []
    assert DiffLine("x", K.CONTEXT).partner is None
