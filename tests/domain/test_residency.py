from app.domain.residency import BlockChange, Change, NetResidency, net_residency

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
