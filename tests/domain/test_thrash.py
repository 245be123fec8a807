"""A block stored again soon after its removal is a thrash; later, or never removed, it is not."""

import pytest

from app.domain.thrash import RecentRemovals


@pytest.mark.parametrize(
    ("removed_at", "stored_at", "thrash"),
    [(100.0, 150.0, True), (100.0, 400.0, True), (100.0, 400.1, False), (None, 150.0, False)],
)
def test_a_block_stored_within_the_window_after_its_removal_is_a_thrash(
    removed_at: float | None, stored_at: float, thrash: bool
) -> None:
    removals = RecentRemovals(window_seconds=300)
    if removed_at is not None:
        removals.removed(7, removed_at)
    assert removals.stored(7, stored_at) is thrash


def test_a_thrash_is_counted_once_and_pruning_forgets_old_removals() -> None:
    removals = RecentRemovals(window_seconds=60)
    removals.removed(1, 0.0)
    removals.removed(2, 100.0)
    assert removals.stored(2, 110.0)
    assert not removals.stored(2, 111.0)  # stored twice after one removal: one thrash
    removals.prune(now=100.0)
    assert removals.removed_at == {}
