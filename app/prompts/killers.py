"""A template's cache killers: replaced whole by each search of its recent traffic
(app/compare/killers.py), read by the template and request pages and the API. The only writer of
CacheKiller.

A killer keeps the keys of a few requests that vary at it, never their text: prompt text is shown
only to viewers holding the ``prompts.read_prompt_text`` permission (``may_read_prompts``).
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, PermissionsMixin
from django.db import transaction
from django.db.models import QuerySet

from app.domain.killers import Killer, KillerSettings
from app.prompts.models import CacheKiller, Template

logger = logging.getLogger(__name__)

READ_PROMPT_TEXT: Final = "prompts.read_prompt_text"


@dataclass(frozen=True, slots=True)
class SampleKey:
    """The key of a request record (its server, request id and arrival time)."""

    server_id: int
    request_id: str
    arrived_at: datetime

    def stored(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "request_id": self.request_id,
            "arrived_at": self.arrived_at.isoformat(),
        }

    @staticmethod
    def of(stored: dict[str, Any]) -> "SampleKey":
        return SampleKey(
            stored["server_id"], stored["request_id"], datetime.fromisoformat(stored["arrived_at"])
        )


@dataclass(frozen=True, slots=True)
class FoundKillers:
    """The killers found in the requests of one compatibility record of a template's window, with the
    keys of each killer's sample requests (in the order of its ``sample_requests``)."""

    salt_hash: str
    model: str
    block_size: int
    mode: CacheKiller.Mode
    killers: tuple[Killer, ...]
    samples: tuple[tuple[SampleKey, ...], ...]


@transaction.atomic
def replace_killers(
    *,
    template_id: int,
    found: Sequence[FoundKillers],
    window_start: datetime,
    window_end: datetime,
    now: datetime,
) -> int:
    """Replace the template's killers with ``found`` (none: the template has none now), in one
    transaction; returns how many are stored. Two runs at once for one template take turns (the
    template's row is locked), so the later one's killers replace the earlier's. A template deleted
    meanwhile stores nothing."""
    if not list(Template.objects.select_for_update().filter(pk=template_id).values_list("pk", flat=True)):
        return 0
    CacheKiller.objects.filter(template_id=template_id).delete()
    rows = killer_rows(
        template_id=template_id, found=found, window_start=window_start, window_end=window_end, now=now
    )
    CacheKiller.objects.bulk_create(rows)
    logger.info("template %s: %d cache killers", template_id, len(rows))
    return len(rows)


def killer_rows(
    *,
    template_id: int,
    found: Sequence[FoundKillers],
    window_start: datetime,
    window_end: datetime,
    now: datetime,
) -> list[CacheKiller]:
    """The killers ``found`` in the template's requests of a window as rows, not saved: what
    ``replace_killers`` stores, and a regression's evidence copies."""
    return [
        _row(template_id, group, killer, samples, window_start=window_start, window_end=window_end, now=now)
        for group in found
        for killer, samples in zip(group.killers, group.samples, strict=True)
    ]


def _row(
    template_id: int,
    group: FoundKillers,
    killer: Killer,
    samples: Sequence[SampleKey],
    *,
    window_start: datetime,
    window_end: datetime,
    now: datetime,
) -> CacheKiller:
    return CacheKiller(
        template_id=template_id, salt_hash=group.salt_hash, model=group.model, block_size=group.block_size,
        computed_at=now, window_start=window_start, window_end=window_end, mode=group.mode,
        position_token=killer.position_token, block_index=killer.position_block, kind=killer.klass.value,
        requests=killer.requests_through, requests_affected=killer.requests_affected,
        continuations=killer.distinct_continuations, tokens_lost=killer.tokens_lost,
        straddle_tokens=killer.straddle.shared_tokens if killer.straddle else None,
        samples=[key.stored() for key in samples],
    )  # fmt: skip


def template_killers(template_id: int) -> QuerySet[CacheKiller]:
    """The template's killers, costliest first."""
    return CacheKiller.objects.filter(template_id=template_id).order_by("-tokens_lost", "block_index", "pk")


def killer_at(
    killers: Sequence[CacheKiller], *, salt_hash: str, diverged_at: int | None
) -> CacheKiller | None:
    """The killer of this salt that a request departing at token ``diverged_at`` from its template's
    earlier requests departs at, if any: at or after the killer's token (its block, in hash-only mode)
    and within ``fanout_window_blocks`` blocks of it, the reach in which find_killers counts a request's
    first unseen block against a killer (a request departs where it first differs from its nearest
    earlier one: into the varying text, a timestamp's later digits). The nearest before it when several
    fit."""
    if diverged_at is None:
        return None
    reach = KillerSettings().fanout_window_blocks
    fitting = [k for k in killers if k.salt_hash == salt_hash and _reaches(k, diverged_at, reach)]
    return max(fitting, key=lambda k: (k.block_index, k.position_token or 0), default=None)


def _reaches(killer: CacheKiller, diverged_at: int, blocks: int) -> bool:
    start = killer.block_index * killer.block_size if killer.position_token is None else killer.position_token
    return start <= diverged_at and diverged_at // killer.block_size <= killer.block_index + blocks


def may_read_prompts(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Whether this viewer may read prompt text (the samples of killers): a logged-in user holding
    ``prompts.read_prompt_text`` (superusers hold every permission). Ingest tokens never do."""
    return isinstance(user, PermissionsMixin) and user.has_perm(READ_PROMPT_TEXT)


def fleet_killers(*, template: str = "", kind: str = "") -> QuerySet[CacheKiller]:
    """Every template's killers (of that template's name and kind when given), costliest first."""
    found = CacheKiller.objects.select_related("template").order_by(
        "-tokens_lost", "template_id", "block_index", "pk"
    )
    if template:
        found = found.filter(template__name=template)
    if kind:
        found = found.filter(kind=kind)
    return found
