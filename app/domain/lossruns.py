"""From the causes of a request's blocks to its losses: runs of consecutive blocks of one cause, and
the cause that lost the most (app/domain/misscauses.py finds each block's cause)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from app.domain.evictions import Eviction
from app.domain.misses import Cause, Diagnosis, Loss, is_loss


@dataclass(frozen=True, slots=True)
class BlockCause:
    cause: Cause
    here: bool = False  # resident on the request's own server: lost only if the chain broke before
    server: int | None = None
    server_tokens: int | None = None
    stored_at: datetime | None = None
    removed_at: datetime | None = None

    @classmethod
    def evicted(cls, eviction: Eviction, cause: Cause = Cause.EVICTED) -> BlockCause:
        """A block removed from GPU memory: `cause` evicted (gone), or demoted (a lower tier kept it)."""
        server, stored_at, removed_at = eviction
        return cls(cause, server=server, stored_at=stored_at, removed_at=removed_at)


def evicted_while_waiting(diagnosis: Diagnosis, eviction: Eviction) -> Diagnosis:
    """The diagnosis with its first loss (unexplained: resident at arrival) evicted instead."""
    first = diagnosis.losses[0]
    server, stored_at, removed_at = eviction
    evicted = Loss(Cause.EVICTED, first.first_token, first.tokens, server, None, stored_at, removed_at)
    losses = [evicted, *diagnosis.losses[1:]]
    return replace(
        diagnosis, losses=tuple(losses), cause=main_cause(losses, reusable=1)
    )  # a block lost: reusable


def main_cause(losses: list[Loss], *, reusable: int) -> Cause | None:
    """The cause that lost the most reusable tokens (the earlier of equal ones). A request that lost
    none: new_content when its own tail was all it did not reuse, below_block when not one block
    could be reused, else None."""
    lost: dict[Cause, int] = {}
    for loss in losses:
        if is_loss(loss.cause):
            lost[loss.cause] = lost.get(loss.cause, 0) + loss.tokens
    if lost:
        return max(lost, key=lambda cause: lost[cause])  # dicts keep order: max keeps the first of ties
    if any(loss.cause == Cause.NEW_CONTENT for loss in losses):
        return Cause.NEW_CONTENT
    return Cause.BELOW_BLOCK if losses and not reusable else None


# Never seen before, so past the family's fan-out point the request's own content.
_OWN_CONTENT = (Cause.PROMPT_CHANGED, Cause.COLD)


def new_content_after(losses: list[Loss], point: int) -> list[Loss]:
    """The losses with the never-seen tokens from `point` on (the family's usual fan-out point,
    app/domain/fanout.py) as new_content: the request's own, never a loss. A run across the point
    is split there."""
    found: list[Loss] = []
    for loss in losses:
        if loss.cause not in _OWN_CONTENT or loss.end <= point:
            found.append(loss)
            continue
        if loss.first_token < point:
            found.append(replace(loss, tokens=point - loss.first_token))
        start = max(loss.first_token, point)
        found.append(Loss(Cause.NEW_CONTENT, first_token=start, tokens=loss.end - start))
    return _merged(found)


def _merged(losses: list[Loss]) -> list[Loss]:
    """Adjacent new_content runs as one."""
    merged: list[Loss] = []
    for loss in losses:
        last = merged[-1] if merged else None
        if last and loss.cause == Cause.NEW_CONTENT == last.cause and last.end == loss.first_token:
            merged[-1] = replace(last, tokens=last.tokens + loss.tokens)
        else:
            merged.append(loss)
    return merged


def within_hit_units(causes: list[BlockCause], *, first_block: int, per_hit: int) -> list[BlockCause]:
    """The causes with each effective block's resident blocks lost for its missing one: a server that
    hits in whole effective blocks of `per_hit` blocks (a hybrid model's) reuses none of a unit one of
    whose blocks is gone, so a block still resident before the gone one in its unit takes its cause
    (after it, loss_runs does the same). Plain servers (`per_hit` 1) are unchanged."""
    if per_hit <= 1:
        return causes
    found = list(causes)
    units: dict[int, list[int]] = {}  # an effective block's number -> its blocks' indices in `causes`
    for i in range(len(found)):
        units.setdefault((first_block + i) // per_hit, []).append(i)
    for unit in units.values():
        missing = next((found[i] for i in unit if not found[i].here), None)
        for i in unit:
            if missing is None or not found[i].here:
                break
            found[i] = missing
    return found


def loss_runs(causes: list[BlockCause], *, first_block: int, size: int) -> list[Loss]:
    """Consecutive blocks of one cause (and server) as one loss, with the first block's details; a
    block resident here after a broken one takes the cause before it (the first lost block resident
    here stays unexplained)."""
    runs: list[list[Any]] = []  # [the run's first block's cause, its blocks]
    for found in causes:
        if runs:
            first = runs[-1][0]
            if found is first or found.here or (found.cause == first.cause and found.server == first.server):
                runs[-1][1] += 1
                continue
        runs.append([found, 1])
    losses: list[Loss] = []
    start = first_block * size
    for found, blocks in runs:
        losses.append(
            Loss(found.cause, start, blocks * size, found.server, found.server_tokens, found.stored_at,
                 found.removed_at)
        )  # fmt: skip
        start += blocks * size
    return losses
