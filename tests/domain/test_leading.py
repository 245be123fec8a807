"""A chain's leading blocks a container holds, in C and in Python alike."""

from collections import OrderedDict
from collections.abc import Container

import pytest

from app.domain.generations import Generations
from app.domain.leading import leading
from tests.support.leading_paths import LEADING_PATHS, use_leading_path


@pytest.fixture(autouse=True, params=LEADING_PATHS)
def leading_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    use_leading_path(request.param, monkeypatch)


CHAIN = [-(2**63), 17, 2**63 - 1, 5]  # signed 64-bit hashes, as the records hold them


@pytest.mark.parametrize(
    ("holding", "held"),
    [
        ({}, 0),
        (dict.fromkeys(CHAIN), 4),
        (dict.fromkeys(CHAIN[:2] + CHAIN[3:]), 2),  # the run stops at the first missing block
        (set(CHAIN[1:]), 0),
        (frozenset(CHAIN[:3]), 3),
        (OrderedDict.fromkeys([None, *CHAIN[:1]]), 1),  # an OrderedDict: the dict's own contains
    ],
)
def test_counts_the_leading_run_only(holding: Container[object], held: int) -> None:
    assert leading(CHAIN, holding) == held
    assert leading(tuple(CHAIN), holding) == held


def test_an_empty_chain_has_no_leading_blocks() -> None:
    assert leading([], {1: True}) == 0


def test_a_container_of_python_is_asked_through_its_contains() -> None:
    seen: Generations[int, bool] = Generations()
    seen.write_all(CHAIN[:2], True)
    seen.turn()  # the old generation: __contains__ in Python looks in both
    seen.write_all(CHAIN[2:3], True)
    assert leading(CHAIN, seen) == 3


def test_a_contains_that_changes_the_chain_reads_it_again() -> None:
    chain = [1, 2, 3, 4]

    class Shrinking:
        def __contains__(self, key: object) -> bool:
            del chain[-1]  # the C loop must not read past the list's new end
            return True

    assert leading(chain, Shrinking()) == 2


def test_an_unhashable_block_raises_as_in_python() -> None:
    with pytest.raises(TypeError):
        leading([[1]], {})
