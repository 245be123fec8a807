"""Typed readers of environment variables that fail loudly on a bad value.

Settings call these once at start-up; a typo in a variable stops the process
with a message naming the variable instead of running with a silent default.
"""

import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingError(ValueError):
    """An environment variable holds a value the setting cannot use."""


def env_str(name: str, default: str | None = None) -> str:
    """The variable's value, or `default`; raise when both are missing."""
    value = os.environ.get(name, "")
    if value:
        return value
    if default is None:
        raise SettingError(f"{name} must be set")
    return default


def env_bool(name: str, default: bool) -> bool:
    """true/false, yes/no, on/off or 1/0 (any case)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise SettingError(f"{name}={raw!r} is not a boolean (use true or false)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """An integer, at least `minimum` when one is given."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise SettingError(f"{name}={value} must be at least {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    """A number, at least `minimum` when one is given."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingError(f"{name}={raw!r} is not a finite number")
    if minimum is not None and value < minimum:
        raise SettingError(f"{name}={value} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; blanks around items are ignored."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices`."""
    value = env_str(name, default)
    if value not in choices:
        raise SettingError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value
