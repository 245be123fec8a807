"""A template's cache killers as the Request and Template pages list them: where each is, and links
to the sample requests the viewer may see."""

from collections.abc import Sequence
from dataclasses import dataclass

from django.urls import reverse

from app.compare.killers import Samples
from app.prompts.killers import SampleKey
from app.prompts.models import CacheKiller


@dataclass(frozen=True, slots=True)
class KillerRow:
    """One cache killer's row."""

    killer: CacheKiller
    where: str  # "token 412 (block 25)", or "block 25" in hash-only mode
    sample_links: list[tuple[str, str]]  # (request id, its page)
    samples: Samples | None  # None: not shown to this viewer (or on this page)
    here: bool


def killer_rows(
    killers: Sequence[CacheKiller],
    names: dict[int, str],
    samples: dict[int, Samples],
    *,
    here: CacheKiller | None = None,
    seen: set[SampleKey],
) -> list[KillerRow]:
    """The killers' rows, linking to the sample requests the viewer sees (`seen`)."""
    rows = []
    for killer in killers:
        block = f"block {killer.block_index}"
        where = block if killer.position_token is None else f"token {killer.position_token} ({block})"
        keys = [key for stored in killer.samples if (key := SampleKey.of(stored)) in seen]
        links = [
            (
                k.request_id,
                reverse("dashboard:request-detail", args=[names.get(k.server_id, "?"), k.request_id]),
            )
            for k in keys
        ]
        rows.append(
            KillerRow(killer, where, links, samples.get(killer.pk), here is not None and here.pk == killer.pk)
        )
    return rows
