"""Classify the batch sequence numbers of KV event streams: next, duplicate, gap or restart. Pure.

A stream is one publisher: one server's data-parallel rank (each rank has its own socket and numbers
its own batches). vLLM numbers batches from 0 in each publisher process and adds 1 per batch.

The rule, for a batch with seq ``s`` and time ``ts``, given the last accepted seq ``L`` and the newest
batch time ``T`` of the stream:

1. The stream's first batch is ``Next``, whatever its seq.
2. ``s == L + 1`` is ``Next``; ``s > L + 1`` is ``Gap(L + 1, s - 1)``. Both accept the batch.
3. ``s <= L`` is a ``Restart`` when
   a. ``s < L - replay_window``: replay only serves the newest ``buffer_steps`` batches (10,000 by
      default), so nothing that far back can be a redelivery; or
   b. ``ts > T``: a redelivered batch keeps the time it was made, never after the newest one seen, so a
      lower seq with a newer time comes from a new process. This catches restarts while ``L`` is still
      small, e.g. seq 3 after seq 40 because the new process's first batches were lost while the
      subscriber reconnected.
   Otherwise it is a ``Duplicate`` (a batch seen live and again through replay) and changes nothing.
   A seq of 0 follows the same rule: a caller that backfills from seq 0 gets duplicates, not restarts.
4. A restart starts a new epoch at ``s``; if ``s > 0`` the new process's batches ``0 .. s-1`` were
   missed and a replay from 0 recovers those still buffered.

Sequence numbers alone cannot show every restart: one noticed only after the new process has passed
``L`` (the subscriber was away a long time) reads as a gap.

Replay replies that fill a reported gap are below ``L`` by then and would read as duplicates: the
caller routes them by the gap's range instead of asking the tracker. Replies above ``L`` go through
the tracker, which drops the ones the live stream already delivered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

DEFAULT_REPLAY_WINDOW = 10_000
"""vLLM's default ``buffer_steps``: how many past batches its replay socket keeps."""


@dataclass(frozen=True, slots=True)
class SequenceState:
    """Where one stream stands: its epoch, last accepted seq and newest batch time (vLLM's ``ts``)."""

    epoch: int
    last_seq: int
    newest_ts: float


@dataclass(frozen=True, slots=True)
class Next:
    """The expected batch (or the stream's first): accept it."""

    kind: Literal["next"] = field(default="next", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A batch already accepted: drop it."""

    kind: Literal["duplicate"] = field(default="duplicate", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class Gap:
    """Batches ``first_missing .. last_missing`` (inclusive) were not received; accept this one."""

    first_missing: int
    last_missing: int
    kind: Literal["gap"] = field(default="gap", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class Restart:
    """The publisher restarted: a new epoch begins with this batch. ``previous_last`` ended the old one."""

    previous_last: int
    kind: Literal["restart"] = field(default="restart", init=False, repr=False)


SeqVerdict: TypeAlias = Next | Duplicate | Gap | Restart
"""Tell them apart with ``match`` or by ``kind`` (mypy narrows on either)."""


def observe_seq(
    state: SequenceState | None, seq: int, ts: float, *, replay_window: int = DEFAULT_REPLAY_WINDOW
) -> tuple[SequenceState, SeqVerdict]:
    """Classify the next batch of a stream by the module's rule; return the new state and the verdict.

    ``state`` is None before the stream's first batch. A duplicate returns ``state`` unchanged.
    """
    if state is None:
        return SequenceState(epoch=0, last_seq=seq, newest_ts=ts), Next()
    if seq > state.last_seq:
        advanced = SequenceState(epoch=state.epoch, last_seq=seq, newest_ts=max(ts, state.newest_ts))
        if seq == state.last_seq + 1:
            return advanced, Next()
        return advanced, Gap(first_missing=state.last_seq + 1, last_missing=seq - 1)
    if seq < state.last_seq - replay_window or ts > state.newest_ts:
        restarted = SequenceState(epoch=state.epoch + 1, last_seq=seq, newest_ts=ts)
        return restarted, Restart(previous_last=state.last_seq)
    return state, Duplicate()
