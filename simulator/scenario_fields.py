"""Reading a scenario file's parsed YAML one field at a time, with each field's path for errors.

``Fields`` wraps one mapping and checks its keys; its methods return a field's value with the type
the caller asks for, or raise ``FieldError`` naming the field's path (``tenants[1].weight``) and the
problem. ``simulator.scenario.parse_scenario`` reports a ``FieldError`` as a ``ScenarioError`` with the
same field and problem (this module cannot raise ``ScenarioError`` itself: ``scenario`` imports it).
"""

from __future__ import annotations

import json
import math
import re

MISSING = object()
"""The default of a required field: reading it when it is absent raises FieldError."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


class FieldError(ValueError):
    """A field that cannot be used; ``field`` is its path, ``problem`` says why."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class Fields:
    """One YAML mapping being read, with its path for error messages ("" for the whole file)."""

    def __init__(self, data: object, where: str, allowed: tuple[str, ...]) -> None:
        if not isinstance(data, dict):
            raise FieldError(where or "scenario", f"expected a mapping, got {describe(data)}")
        for key in data:
            if key not in allowed:
                raise FieldError(self._path(where, str(key)), f"unknown field (known: {', '.join(allowed)})")
        self.data: dict[object, object] = data
        self.where = where

    @staticmethod
    def _path(where: str, key: str) -> str:
        return f"{where}.{key}" if where else key

    def path(self, key: str) -> str:
        """The error path of ``key``."""
        return self._path(self.where, key)

    def get(self, key: str, default: object = MISSING) -> object:
        """The raw value; ``default`` when absent, or FieldError when there is no default."""
        if key in self.data:
            return self.data[key]
        if default is MISSING:
            raise FieldError(self.path(key), "required field is missing")
        return default

    def string(self, key: str, default: object = MISSING) -> str:
        """A non-empty string."""
        value = self.get(key, default)
        if not isinstance(value, str) or not value.strip():
            raise FieldError(self.path(key), f"expected a non-empty string, got {describe(value)}")
        return value

    def name(self, key: str) -> str:
        """A name usable as a file name and header value: lower-case letters, digits, '_' and '-'."""
        value = self.string(key)
        if not _NAME.match(value):
            raise FieldError(self.path(key), f"{value!r} must match {_NAME.pattern}")
        return value

    def optional_string(self, key: str) -> str | None:
        """A non-empty string, or None when the field is null or absent."""
        return None if self.get(key, None) is None else self.string(key)

    def number(self, key: str, default: object = MISSING, *, positive: bool = False) -> float:
        """A finite number; not negative, or above 0 when ``positive``. Booleans are not numbers."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise FieldError(self.path(key), f"expected a number, got {describe(value)}")
        if value < 0 or (positive and value == 0):
            raise FieldError(self.path(key), f"must be {'above' if positive else 'at least'} 0, got {value}")
        return float(value)

    def fraction(self, key: str, default: object = MISSING) -> float:
        """A number from 0 to 1."""
        value = self.number(key, default)
        if value > 1:
            raise FieldError(self.path(key), f"must be between 0 and 1, got {value}")
        return value

    def integer(self, key: str, *, minimum: int, default: object = MISSING) -> int:
        """An integer of at least ``minimum``."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError(self.path(key), f"expected an integer, got {describe(value)}")
        if value < minimum:
            raise FieldError(self.path(key), f"must be at least {minimum}, got {value}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: object = MISSING) -> str:
        """One of ``choices``; the caller narrows the type."""
        value = self.get(key, default)
        if value not in choices:
            raise FieldError(self.path(key), f"expected one of {', '.join(choices)}, got {describe(value)}")
        return str(value)

    def items(self, key: str, default: object = MISSING, *, allow_empty: bool = False) -> list[object]:
        """A list, non-empty unless ``allow_empty``."""
        value = self.get(key, default)
        if not isinstance(value, list):
            raise FieldError(self.path(key), f"expected a list, got {describe(value)}")
        if not value and not allow_empty:
            raise FieldError(self.path(key), "must not be empty")
        return value

    def strings(self, key: str, *, allow_empty: bool) -> list[str]:
        """A list of non-empty strings; required and non-empty unless ``allow_empty`` (absent: [])."""
        values = self.items(key, [] if allow_empty else MISSING, allow_empty=allow_empty)
        for i, value in enumerate(values):
            if not isinstance(value, str) or not value.strip():
                raise FieldError(
                    f"{self.path(key)}[{i}]", f"expected a non-empty string, got {describe(value)}"
                )
        return [str(value) for value in values]

    def json_mapping(self, key: str, default: object = MISSING) -> dict[str, object]:
        """A mapping JSON can represent, copied through JSON (what a request can carry)."""
        value = self.get(key, default)
        if not isinstance(value, dict):
            raise FieldError(self.path(key), f"expected a mapping, got {describe(value)}")
        try:
            mapping: dict[str, object] = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise FieldError(self.path(key), f"not representable as JSON: {exc}") from exc
        return mapping


def check_unique(names: list[str], where: str) -> None:
    """Raise FieldError at ``<where>[i].name`` for the first name used a second time."""
    for i, name in enumerate(names):
        if name in names[:i]:
            raise FieldError(f"{where}[{i}].name", f"{name!r} is used twice")


def check_total(weights: list[float], where: str, what: str) -> None:
    """Raise FieldError at ``where`` unless some weight is above 0; ``what`` names the weights."""
    if sum(weights) <= 0:
        raise FieldError(where, f"the {what} add up to 0; at least one must be above 0")


def describe(value: object) -> str:
    """A short description of a bad value for an error message: its type and a clipped repr."""
    if value is MISSING:
        return "nothing"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
