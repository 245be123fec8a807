"""The two ways app/domain/leading.py counts a chain's leading blocks, for tests to run each."""

import pytest

from app.domain import leading

LEADING_PATHS = ["python", "c"]


def use_leading_path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count from here on in "python" (takewhile) or in "c" (app/domain/_chain.c, what an install
    with a C compiler runs; skipped where it was not built)."""
    if path == "c":
        if not leading.leading_in_c():
            pytest.skip("app/domain/_chain.c was not built (no C compiler at install)")
        return
    monkeypatch.setattr(leading, "_native", None)
