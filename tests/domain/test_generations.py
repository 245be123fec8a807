"""The forgetting mapping of a kept history: what is written each generation stays, the rest goes."""

import pytest

from app.domain.generations import Generations
from tests.support.leading_paths import LEADING_PATHS, use_leading_path


@pytest.fixture(autouse=True, params=LEADING_PATHS)
def leading_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: chains' leading blocks counted in Python, then in app/domain/_chain.c."""
    use_leading_path(request.param, monkeypatch)


def test_an_entry_lives_two_generations_unless_written_again() -> None:
    found: Generations[int, str] = Generations()
    found[1] = "a"
    found.write_all([2, 3], "b")
    found.turn()
    assert 1 in found and found.get(2) == "b" and len(found) == 3
    assert found.setdefault(2, "other") == "b"  # kept, and written again: it stays
    found[4] = "c"
    found.turn()
    assert sorted(found) == [2, 4] and 1 not in found and found.get(3) is None
    assert found.pop(2) == "b" and 2 not in found and found.pop(2) is None
