import random

import pytest

from app.domain.residency import (
    BlockChange,
    Change,
    NetResidency,
    net_residency,
    net_residency_of_columns,
    net_residency_of_epoch,
)

STORED, REMOVED, CLEARED = Change.STORED, Change.REMOVED, Change.CLEARED


def test_stored_blocks_are_added_with_their_parent() -> None:
    net = net_residency([BlockChange(STORED, 1, None), BlockChange(STORED, 2, 1)])
    assert net == NetResidency(stored={1: None, 2: 1})


def test_a_block_removed_after_being_stored_is_only_removed() -> None:
    net = net_residency([BlockChange(STORED, 1), BlockChange(REMOVED, 1)])
    assert net == NetResidency(removed={1})


def test_a_block_stored_again_after_removal_is_resident() -> None:
    net = net_residency([BlockChange(REMOVED, 7), BlockChange(STORED, 7, 3)])
    assert net == NetResidency(stored={7: 3})


def test_clearing_forgets_everything_before_it_but_not_after() -> None:
    net = net_residency(
        [BlockChange(STORED, 1), BlockChange(REMOVED, 2), BlockChange(CLEARED), BlockChange(STORED, 3)]
    )
    assert net == NetResidency(cleared=True, stored={3: None})


def test_no_changes_change_nothing() -> None:
    assert net_residency([]) == NetResidency()


def test_only_the_last_clear_counts() -> None:
    net = net_residency(
        [
            BlockChange(STORED, 1),
            BlockChange(CLEARED),
            BlockChange(STORED, 2),
            BlockChange(CLEARED),
            BlockChange(REMOVED, 3),
            BlockChange(STORED, 4, 2),
        ]
    )
    assert net == NetResidency(cleared=True, removed={3}, stored={4: 2})


def test_a_block_stored_twice_keeps_its_last_parent() -> None:
    net = net_residency([BlockChange(STORED, 5, 1), BlockChange(REMOVED, 5), BlockChange(STORED, 5, 2)])
    assert net == NetResidency(stored={5: 2})


def test_changes_without_a_hash_change_nothing() -> None:
    assert net_residency([BlockChange(STORED), BlockChange(REMOVED)]) == NetResidency()


def test_the_column_form_folds_like_the_change_list() -> None:
    changes = [
        BlockChange(STORED, 1),
        BlockChange(REMOVED, 2),
        BlockChange(STORED, 2, 1),
        BlockChange(REMOVED, 1),
    ]
    columns = net_residency_of_columns(
        [c.change for c in changes], [c.block_hash for c in changes], [c.parent_hash for c in changes]
    )
    assert columns == net_residency(changes) == NetResidency(removed={1}, stored={2: 1})


def folded_one_by_one(changes: list[BlockChange]) -> NetResidency:
    """The fold written plainly, change by change: what net_residency must agree with."""
    net = NetResidency()
    for item in changes:
        if item.change is CLEARED:
            net = NetResidency(cleared=True)
        elif item.block_hash is not None and item.change is STORED:
            net.removed.discard(item.block_hash)
            net.stored[item.block_hash] = item.parent_hash
        elif item.block_hash is not None:
            net.stored.pop(item.block_hash, None)
            net.removed.add(item.block_hash)
    return net


def test_random_runs_fold_as_change_by_change() -> None:
    rng = random.Random(7)
    kinds, hashes, parents = [STORED, STORED, REMOVED, REMOVED, CLEARED], [None, *range(6)], [None, 1, 2]
    for _ in range(500):
        changes = [
            BlockChange(rng.choice(kinds), rng.choice(hashes), rng.choice(parents))
            for _ in range(rng.randrange(12))
        ]
        assert net_residency(changes) == folded_one_by_one(changes)


@pytest.mark.parametrize(
    ("epoch", "resident_epoch", "expected"),
    [
        (0, None, NetResidency(removed={1}, stored={2: None})),  # nothing committed yet: as it is
        (3, 3, NetResidency(removed={1}, stored={2: None})),  # the same process goes on
        (4, 3, NetResidency(cleared=True, removed={1}, stored={2: None})),  # restarted: starts empty
        (2, 3, NetResidency()),  # from a process that is gone
    ],
)
def test_a_new_epoch_starts_from_an_empty_cache(
    epoch: int, resident_epoch: int | None, expected: NetResidency
) -> None:
    net = NetResidency(removed={1}, stored={2: None})
    assert net_residency_of_epoch(net, epoch=epoch, resident_epoch=resident_epoch) == expected
