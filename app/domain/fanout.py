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
learned again from that generation's departures, and the change becomes its usual shape.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

RELEARNED_FROM = 16  # departures in a generation for the turn to learn a family's point again
QUANTILE = 0.1  # the share of departures at or before the point


class FanOutPoints:
    """The usual fan-out point, in prompt tokens, of each family."""

    def __init__(self) -> None:
        self._points: dict[Hashable, int] = {}
        self._learning: dict[Hashable, Counter[int]] = {}  # departures this generation, by token

    def departed(self, family: Hashable, at_token: int) -> None:
        """A request of the family shared `at_token` leading tokens with earlier prompts, and not more."""
        learning = self._learning.setdefault(family, Counter())
        learning[at_token] += 1
        learned = _low_quantile(learning)
        self._points[family] = max(self._points.get(family, learned), learned)

    def point(self, family: Hashable) -> int | None:
        """Where the family's prompts usually part; None before its first departure."""
        return self._points.get(family)

    def turn(self) -> None:
        """Learn each family's point again from this generation's departures (one with too few keeps
        the point it had); a family that did not depart this generation is forgotten."""
        points: dict[Hashable, int] = {}
        for family, learning in self._learning.items():
            held = self._points.get(family)
            relearn = held is None or learning.total() >= RELEARNED_FROM
            points[family] = _low_quantile(learning) if relearn or held is None else held
        self._points, self._learning = points, {}


def _low_quantile(departures: Counter[int]) -> int:
    """The smallest departure with at least QUANTILE of them at or before it."""
    wanted = departures.total() * QUANTILE
    counted = 0
    for at_token in sorted(departures):
        counted += departures[at_token]
        if counted >= wanted:
            return at_token
    raise AssertionError("a non-empty count has a quantile")  # pragma: no cover
