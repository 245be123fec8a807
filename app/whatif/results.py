"""A what-if's answers as the JSON kept on its question, and back (msgspec: the domain's dataclasses)."""

from typing import Any

import msgspec

from app.domain.replay.whatif import WhatIf


def to_json(answers: WhatIf) -> dict[str, Any]:
    """The answers as plain JSON values."""
    found: dict[str, Any] = msgspec.to_builtins(answers)
    return found


def from_json(data: dict[str, Any]) -> WhatIf:
    """The answers `to_json` wrote. Raises msgspec.ValidationError when the shape is not a WhatIf's."""
    return msgspec.convert(data, WhatIf)
