"""What a template check found: one finding per problem, with the rule it breaks, where, and why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from app.domain.killers import KillerClass

Level = Literal["error", "warning", "note"]


class Rule(StrEnum):
    """The rules a check applies; the values are SARIF rule ids and the JSON's ``rule``."""

    NONDETERMINISTIC = "nondeterministic"
    ABOVE_MARKER = "varies-above-marker"
    MARKER_MISSING = "marker-missing"
    PREFIX_SHRINKS = "prefix-shrinks"
    GOLDEN_DRIFT = "golden-drift"
    COST_OVER_THRESHOLD = "cost-over-threshold"
    CANNOT_RENDER = "cannot-render"
    PREFIX_CHANGES = "prefix-changes"
    NO_TRAFFIC = "no-traffic"


DESCRIPTIONS: Final[dict[Rule, str]] = {
    Rule.NONDETERMINISTIC: "A render of one sample changed under a condition that must not change a prompt "
    "(clock, time zone, random seed, hash seed, locale, set or dict order).",
    Rule.ABOVE_MARKER: "A per-request variable, or text that differs between samples, is above the boundary "
    "marker: the part meant to be shared is not.",
    Rule.MARKER_MISSING: "The boundary marker the repository names does not appear in the render.",
    Rule.PREFIX_SHRINKS: "The commit shortens the stable prefix by a block or more: requests reuse less.",
    Rule.GOLDEN_DRIFT: "The stable prefix differs from its committed golden copy.",
    Rule.COST_OVER_THRESHOLD: "The change's predicted cost with live traffic is over the threshold.",
    Rule.CANNOT_RENDER: "The template could not be rendered with a sample, so it could not be checked.",
    Rule.PREFIX_CHANGES: "The commit changes the stable prefix's text: the cache refills once.",
    Rule.NO_TRAFFIC: "The server has no traffic of the template over the window: the change is not priced.",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem (``error``), risk (``warning``) or fact (``note``) of one template at one place.

    ``line`` is the template's line (None where it is unknown: a builder command's output, a chat
    template's own text); ``token`` the prompt's token index; ``variable`` and ``klass`` what varies."""

    rule: Rule
    level: Level
    template: str
    path: str
    message: str
    line: int | None = None
    token: int | None = None
    variable: str | None = None
    klass: KillerClass | None = None
