"""A what-if's answers as the JSON kept on its question, and back (msgspec: the domain's dataclasses),
and as the API and `manage.py whatif --json` give them."""

from datetime import UTC, datetime
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


def answers_out(answers: WhatIf) -> dict[str, Any]:
    """The answers as given out: the kept JSON with what the calibration derives from its counts (the
    hit rates, the error in points, the share exact, the trust) and whether the answers are trusted."""
    found = to_json(answers)
    calibration = answers.calibration
    found["calibration"] |= {
        "reported_hit_rate": calibration.reported_hit_rate,
        "replayed_hit_rate": calibration.replayed_hit_rate,
        "error_points": calibration.error_points,
        "exact_share": calibration.exact_share,
        "trust": calibration.trust.value,
    }
    found["trusted"] = answers.trusted
    found["restarts"] = [
        {"at": datetime.fromtimestamp(r.at, UTC).isoformat(), "server": r.server, "num_blocks": r.num_blocks}
        for r in answers.restarts
    ]
    return found
