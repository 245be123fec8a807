"""Bounded label sets for Prometheus: the N values with the most traffic keep their name, the rest
are summed under `other`, so that a fleet's thousand tenants cannot blow up the series count."""

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

OTHER = "other"
K = TypeVar("K", bound=Hashable)


def top_values(traffic: Iterable[tuple[str, float]], n: int) -> frozenset[str]:
    """The `n` values with the most traffic (summed over repeats); ties broken by name, so that the
    set is the same on every scrape of the same data."""
    totals: dict[str, float] = {}
    for value, amount in traffic:
        totals[value] = totals.get(value, 0.0) + amount
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    return frozenset(value for value, _ in ranked[:n])


def bounded(value: str, kept: frozenset[str]) -> str:
    return value if value in kept else OTHER


def summed(rows: Iterable[tuple[K, Mapping[str, float]]]) -> dict[K, dict[str, float]]:
    """Rows of (key, {column: value}) summed per key, columns kept apart."""
    result: dict[K, dict[str, float]] = {}
    for key, values in rows:
        into = result.setdefault(key, {})
        for column, value in values.items():
            into[column] = into.get(column, 0.0) + value
    return result
