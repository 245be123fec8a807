"""How many of a chain's leading blocks a container holds, one after the other.

The diagnosis asks it of every request's chain several times (resident here, on each compatible
server, in its family's memory, seen before): in app/domain/_chain.c when it was built at install,
else with takewhile in Python (what the C loop does, a call of __contains__ per block slower).
tests/domain/test_leading.py and tests/domain/test_misscauses.py run both.
"""

from collections.abc import Container, Sequence
from itertools import takewhile

try:  # built from app/domain/_chain.c at install when a compiler was at hand
    from app.domain import _chain as _native
except ImportError:
    _native = None  # type: ignore[assignment]


def leading(keys: Sequence[object], holding: Container[object]) -> int:
    """How many of `keys`' leading items `holding` contains, up to the first it does not."""
    if _native is not None:
        return _native.leading(keys, holding)
    return len(list(takewhile(holding.__contains__, keys)))


def leading_in_c() -> bool:
    """Whether `leading` runs in app/domain/_chain.c (built at install), not in Python."""
    return _native is not None
