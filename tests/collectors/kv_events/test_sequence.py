"""Sequence tracking tells next, duplicate, gap and restart apart by the rule in sequence.py."""

from __future__ import annotations

import pytest

from collectors.kv_events.sequence import (
    Duplicate,
    Gap,
    Next,
    Restart,
    SequenceState,
    SeqVerdict,
    observe_seq,
)

WINDOW = 100
T = 1000.0  # the newest batch time of the state under test


def at(last_seq: int, epoch: int = 0) -> SequenceState:
    return SequenceState(epoch=epoch, last_seq=last_seq, newest_ts=T)


@pytest.mark.parametrize(
    ("state", "seq", "ts", "verdict", "after"),
    [
        # first batch of a stream: accepted whatever its seq
        (None, 0, T, Next(), at(0)),
        (None, 57, T, Next(), at(57)),
        # in order
        (at(5), 6, T + 1, Next(), SequenceState(0, 6, T + 1)),
        (at(5), 6, T - 1, Next(), at(6)),  # the newest time never moves back
        # gaps: one or many batches missing
        (at(5), 7, T + 1, Gap(6, 6), SequenceState(0, 7, T + 1)),
        (at(5), 900, T + 1, Gap(6, 899), SequenceState(0, 900, T + 1)),
        # duplicates: at or below last, within the window, not newer than anything seen
        (at(5), 5, T, Duplicate(), at(5)),
        (at(5), 0, T - 3, Duplicate(), at(5)),  # a backfill from 0 re-sends 0
        (at(500), 400, T - 9, Duplicate(), at(500)),  # exactly last - window
        # restarts: far below last, or below last with a newer time
        (at(500), 399, T - 9, Restart(500), SequenceState(1, 399, T - 9)),  # beyond the window
        (at(500, epoch=3), 0, T - 9, Restart(500), SequenceState(4, 0, T - 9)),  # back to 0 after a high seq
        (at(40), 0, T + 30, Restart(40), SequenceState(1, 0, T + 30)),  # back to 0, newer time
        (at(40), 3, T + 30, Restart(40), SequenceState(1, 3, T + 30)),  # first batches lost on reconnect
        (at(0), 0, T + 30, Restart(0), SequenceState(1, 0, T + 30)),  # died after its first batch
    ],
)
def test_observe_seq_classifies_by_the_rule(
    state: SequenceState | None, seq: int, ts: float, verdict: SeqVerdict, after: SequenceState
) -> None:
    assert observe_seq(state, seq, ts, replay_window=WINDOW) == (after, verdict)


def test_default_window_is_vllms_default_replay_buffer() -> None:
    assert observe_seq(at(10_500), 500, T)[1] == Duplicate()
    assert observe_seq(at(10_500), 499, T)[1] == Restart(10_500)


def test_one_stream_is_followed_through_gap_replay_and_restart() -> None:
    batches = [
        (0, T),
        (1, T),
        (3, T + 1),
        (2, T),  # the replayed gap fill reads as a duplicate here: route it by the gap
        (4, T + 1),
        (4, T + 1),  # the live copy of a batch replay already delivered
        (1, T + 60),  # a lower seq, a minute later: a new process
    ]
    state: SequenceState | None = None
    seen = []
    for seq, ts in batches:
        state, verdict = observe_seq(state, seq, ts, replay_window=WINDOW)
        seen.append(verdict)
    assert seen == [Next(), Next(), Gap(2, 2), Duplicate(), Next(), Duplicate(), Restart(4)]
    assert [v.kind for v in seen] == ["next", "next", "gap", "duplicate", "next", "duplicate", "restart"]
    assert state == SequenceState(epoch=1, last_seq=1, newest_ts=T + 60)


def test_a_stream_resumes_from_a_stored_state() -> None:
    state, verdict = observe_seq(SequenceState(epoch=2, last_seq=41, newest_ts=T), 42, T + 1)
    assert (state, verdict) == (SequenceState(epoch=2, last_seq=42, newest_ts=T + 1), Next())


def test_gap_kind_narrows_to_its_bounds() -> None:
    verdict = observe_seq(at(5), 9, T)[1]
    assert verdict.kind == "gap"
    assert (verdict.first_missing, verdict.last_missing) == (6, 8)
