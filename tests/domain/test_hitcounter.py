"""A hit counter that is not wired: no hit reported while repeats got much faster."""

import pytest

from app.domain.hitcounter import CounterEvidence, counter_not_wired


@pytest.mark.parametrize(
    ("evidence", "not_wired"),
    [
        (CounterEvidence(40, 0, 20, 0.1, 20, 1.0), True),  # repeats ten times faster, no hit said
        (CounterEvidence(40, 900, 20, 0.1, 20, 1.0), False),  # hits reported: the counter works
        (CounterEvidence(40, 0, 20, 0.9, 20, 1.0), False),  # repeats no faster: nothing reused
        (CounterEvidence(40, 0, 4, 0.1, 36, 1.0), False),  # too few repeats to say
        (CounterEvidence(40, 0, 20, 0.002, 20, 0.006), False),  # milliseconds either way: noise
        (CounterEvidence(40, 0, 20, None, 20, 1.0), False),  # no TTFT reported
    ],
)
def test_the_counter_is_not_wired_only_when_repeats_are_much_faster_and_no_hit_was_said(
    evidence: CounterEvidence, not_wired: bool
) -> None:
    assert counter_not_wired(evidence) is not_wired
