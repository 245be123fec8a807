"""One request's diagnosis as it is shown: its losses worded, and where its prompt departs. Read from
the stored row (`RequestDiagnosis.loss_runs`), for the request page and any answer that words them."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from app.domain.misses import PART_LABELS, Cause, Loss, RequestPart, cause_label
from app.domain.requestparts import part_at
from app.traffic.models import RequestDiagnosis


@dataclass(frozen=True, slots=True)
class Departure:
    """Where a prompt-changed request departs, worded as its lost tokens are listed.

    `at` is the diagnosis' token where the prompt departs from its template's earlier prompts under
    its own salt (token-exact); its losses are by block. When `at` lies in a block lost to another
    cause (a salted request whose first block another tenant's salt had: no block of it was shared
    under its own salt), the prompt-changed loss starts later, at `changed_from`, and `lost_to` names
    the cause of the block `at` lies in. `part` is the request part `at` lies in, where the gateway
    learned where its parts start ("" where not)."""

    at: int
    changed_from: int
    block: int | None
    lost_to: str  # "" when `at` lies in the prompt-changed loss itself
    part: str = ""


@dataclass(frozen=True, slots=True)
class ShownLoss:
    """A run of blocks lost to one cause, worded: its tokens, the cause's label, and where the
    blocks were (the server holding them, or when they were stored and removed)."""

    first_token: int
    last_token: int
    tokens: int
    label: str
    detail: str


def loss_at(losses: Sequence[Loss], token: int) -> Loss | None:
    """The loss the token lies in; None when it was not lost."""
    return next((loss for loss in losses if loss.holds(token)), None)


def departure(
    diagnosis: RequestDiagnosis | None, *, block_size: int | None, starts: Mapping[str, int] | None = None
) -> Departure | None:
    """Where the diagnosed prompt departs (`starts`: the record's part starts, when known); None when
    it was not found changed."""
    if diagnosis is None or diagnosis.diverged_at is None:
        return None
    at, changed_from = diagnosis.diverged_at, diagnosis.changed_from
    part = _span_label(part_at(starts or {}, at))
    if changed_from is None or at >= changed_from:
        return Departure(at=at, changed_from=at, block=None, lost_to="", part=part)
    holding = loss_at(diagnosis.loss_runs, at)
    label = cause_label(holding.cause) if holding else "not lost"
    block = at // block_size if block_size else None
    return Departure(at=at, changed_from=changed_from, block=block, lost_to=label.lower(), part=part)


def _span_label(part: RequestPart | None) -> str:
    """A part as a span of the prompt: "latest messages", "conversation history"."""
    if part is None:
        return ""
    return "conversation history" if part == RequestPart.HISTORY else PART_LABELS[part].lower()


def shown_losses(diagnosis: RequestDiagnosis | None, *, names: dict[int, str]) -> list[ShownLoss]:
    """Its losses in prompt order, servers named from `names` (server id -> name; "?" when not
    there: one the viewer does not see)."""
    if diagnosis is None:
        return []
    return [
        ShownLoss(
            first_token=loss.first_token,
            last_token=loss.end - 1,
            tokens=loss.tokens,
            label=cause_label(loss.cause),
            detail=_detail(loss, names),
        )
        for loss in diagnosis.loss_runs
    ]


def _detail(loss: Loss, names: dict[int, str]) -> str:
    where = names.get(loss.server, "?") if loss.server is not None else "?"
    if loss.cause == Cause.ROUTED_ELSEWHERE:
        return f"resident on {where}: its first {loss.server_tokens} tokens"
    if loss.cause == Cause.EVICTED:
        stored = _moment(loss.stored_at, "before the events kept")
        return f"on {where}: stored {stored}, removed {_moment(loss.removed_at, '?')}"
    return ""


def _moment(at: datetime | None, unknown: str) -> str:
    """As the diagnosis stored it (ISO 8601)."""
    return at.isoformat() if at is not None else unknown
