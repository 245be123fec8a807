"""Where a template's (or prefix family's) requests usually stop sharing: its fan-out point.

Every prompt ends with its own content (the question, the retrieved chunks, the conversation's last
turn): it was never reusable, so the tokens past the point where the family's prompts normally part
are `new_content`, not a loss, and only a departure before that point is `prompt_changed` (the
stable part changed: a timestamp, a reordered tool list).

A request departs where its prompt leaves what was seen before under its salt (the funnel's "seen
before" step), counted when it shared some leading blocks and not all. The family's point is a low
quantile of those departures (a tenth of them depart earlier): a conversation's turns depart at or
after the end of the system prompt, deeper with each turn, so the low end is the stable prefix, and
a rare departure earlier (a tenant's own branch of the template) does not move it.

Within a generation (the history's `turn`) the point only deepens: learned from the family's
departures so far, it moves on when more of them show a longer stable prefix, never back towards the
top. A template that starts departing at its top so keeps reading `prompt_changed` for the rest of
the generation in which it changed (its regression is found meanwhile); at the turn the point is
learned again from that generation's departures, and the change becomes its usual shape. Unless
those departures went on with text the family's earlier prompts held (a timestamp above the system
prompt: misscauses `_learn_fan_out`): a volatile token's departure teaches nothing
(`departed_volatile`), so a template left volatile keeps its loss, however long its volatile span
(app/domain/familiar.py finds the shared text where the span shifted it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable

RELEARNED_FROM = 16  # departures in a generation for the turn to learn a family's point again
QUANTILE = 0.1  # the share of departures at or before the point


class FanOutPoints:
    """The usual fan-out point, in prompt tokens, of each family."""

    def __init__(self) -> None:
        self._points: dict[Hashable, int] = {}
        self._learning: dict[Hashable, LowQuantile] = {}  # departures this generation

    def departed(self, family: Hashable, at_token: int) -> None:
        """A request of the family shared `at_token` leading tokens with earlier prompts, and not more."""
        learning = self._learning.get(family)
        if learning is None:
            learning = self._learning[family] = LowQuantile()
        learned = learning.add(at_token)
        self._points[family] = max(self._points.get(family, learned), learned)

    def departed_volatile(self, family: Hashable) -> None:
        """A request of the family departed at a volatile token and went on with its family's
        usual text: it says nothing of where the family's prompts part, but the family is in use,
        so its point is kept through the next turn."""
        if family in self._points and family not in self._learning:
            self._learning[family] = LowQuantile()

    def point(self, family: Hashable) -> int | None:
        """Where the family's prompts usually part; None before its first departure."""
        return self._points.get(family)

    def turn(self) -> None:
        """Learn each family's point again from this generation's departures (one with too few keeps
        the point it had); a family that did not depart this generation (volatile departures count
        as departing) is forgotten."""
        points: dict[Hashable, int] = {}
        for family, learning in self._learning.items():
            held = self._points.get(family)
            relearn = held is None or learning.count >= RELEARNED_FROM
            points[family] = learning.value if relearn or held is None else held
        self._points, self._learning = points, {}


class LowQuantile:
    """The smallest departure with at least QUANTILE of them at or before it, kept as they come:
    the lowest share in a max-heap, the rest in a min-heap (a chat family departs at a new depth
    with nearly every turn, so sorting its departures each time would cost a sort per request)."""

    __slots__ = ("_high", "_low", "count")

    def __init__(self) -> None:
        self._low: list[int] = []  # negated: the largest of the lowest share on top
        self._high: list[int] = []
        self.count = 0

    @property
    def value(self) -> int:
        return -self._low[0]

    def add(self, at_token: int) -> int:
        """Count one departure; the quantile with it."""
        self.count += 1
        if self._low and at_token < -self._low[0]:
            heapq.heappush(self._low, -at_token)
        else:
            heapq.heappush(self._high, at_token)
        wanted = max(1, math.ceil(self.count * QUANTILE))
        while len(self._low) > wanted:
            heapq.heappush(self._high, -heapq.heappop(self._low))
        while len(self._low) < wanted:
            heapq.heappush(self._low, -heapq.heappop(self._high))
        return -self._low[0]
