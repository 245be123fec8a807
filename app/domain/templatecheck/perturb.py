"""The conditions a prompt builder meets in production that must not change its prompt, and the
variations of a sample that locate where each per-request variable enters it.

A perturbation changes one thing of a sample's render: the wall clock, the time zone, the random seed,
the process's hash seed or locale (for builder commands), the order of one unordered collection, or the
key order of one mapping. A render that changes under one is not deterministic, and the perturbation
names the cause. A swap gives one per-request variable another sample's value: where the render changes
first is where that variable enters the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo

from app.domain.templatecheck.config import TemplateEntry

Kind = Literal["clock", "zone", "seed", "hash_seed", "locale", "order", "keys"]

LABELS: Final[dict[Kind, str]] = {
    "clock": "wall clock",
    "zone": "time zone",
    "seed": "random seed",
    "hash_seed": "hash seed",
    "locale": "locale",
    "order": "set order",
    "keys": "dict order",
}
CLOCK_MOVE: Final = timedelta(days=1, hours=3, minutes=7, seconds=11, microseconds=500_000)
OTHER_ZONE: Final = "Asia/Kolkata"  # a half-hour offset: any formatting that shows the zone or hour moves


@dataclass(frozen=True, slots=True)
class Conditions:
    """What a render may depend on besides its context. Jinja renders read ``now`` (in ``zone``) and
    ``seed``; builder commands get all of them through their environment
    (app/prompts/templatecheck/run.py)."""

    now: datetime
    zone: str = "UTC"
    seed: int = 0
    hash_seed: int = 0
    locale: str = "C.UTF-8"

    @property
    def local_now(self) -> datetime:
        return self.now.astimezone(ZoneInfo(self.zone))


@dataclass(frozen=True, slots=True)
class Variant:
    """A sample's context under other conditions: ``kind`` and ``variable`` say what was changed
    (``swap`` for a per-request variable given another sample's value; None for the sample itself)."""

    sample: int
    kind: Kind | Literal["swap"] | None
    variable: str | None
    context: Mapping[str, Any]
    conditions: Conditions

    @property
    def label(self) -> str:
        if self.kind is None:
            return "the sample"
        if self.kind == "swap":
            return "per request"
        return LABELS[self.kind]


def perturbations(entry: TemplateEntry, sample: int, base: Conditions, *, command: bool) -> list[Variant]:
    """The sample itself, then each perturbation of it: the clock, zone and seed always; the hash seed
    and locale for builder commands (a Jinja render has neither); the order of each ``unordered``
    list; the key order of each mapping at any depth but those ``ordered``."""
    context = entry.samples[sample]
    found = [Variant(sample, None, None, context, base)]
    changed: list[tuple[Kind, Conditions]] = [
        ("clock", replace(base, now=base.now + CLOCK_MOVE)),
        ("zone", replace(base, zone=OTHER_ZONE)),
        ("seed", replace(base, seed=base.seed + 1)),
    ]
    if command:
        changed += [
            ("hash_seed", replace(base, hash_seed=base.hash_seed + 1)),
            ("locale", replace(base, locale="C")),
        ]
    found += [Variant(sample, kind, None, context, conditions) for kind, conditions in changed]
    for name in entry.unordered:
        if isinstance(context.get(name), list) and len(context[name]) > 1:
            moved = {**context, name: _reordered(context[name])}
            found.append(Variant(sample, "order", name, moved, base))
    for name, value in context.items():
        if name not in entry.ordered and _has_mapping(value):
            found.append(Variant(sample, "keys", name, {**context, name: _keys_reversed(value)}, base))
    return found


def swaps(entry: TemplateEntry, base: Conditions) -> list[Variant]:
    """For each per-request and per-user variable, the first sample with each other value the samples
    give it (the configuration guarantees one at least): together they reach where it varies first."""
    first = entry.samples[0]
    found = []
    for name in (*entry.per_request, *entry.per_user):
        values = {repr(sample.get(name)): sample.get(name) for sample in entry.samples[1:]}
        values.pop(repr(first.get(name)), None)
        found += [Variant(0, "swap", name, {**first, name: value}, base) for value in values.values()]
    return found


def _reordered(items: list[Any]) -> list[Any]:
    """Another order of the items: reversed (rotated instead where reversing changes nothing)."""
    reverse = items[::-1]
    return reverse if reverse != items else items[1:] + items[:1]


def _has_mapping(value: Any) -> bool:
    if isinstance(value, Mapping):
        return len(value) > 1 or any(_has_mapping(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_mapping(item) for item in value)
    return False


def _keys_reversed(value: Any) -> Any:
    """A copy whose mappings, at every depth, have their keys in reverse order."""
    if isinstance(value, Mapping):
        return {key: _keys_reversed(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_keys_reversed(item) for item in value]
    return value
