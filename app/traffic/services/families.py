"""The prefix family of each ingested request record without template metadata (app/prompts/models.py
PrefixFamily): its leading blocks' salt-neutral hash, looked up (made when new) for a whole batch at once.
"""

from collections.abc import Sequence
from dataclasses import replace

from django.conf import settings

from app.domain.blockhash import signed_block_hashes
from app.fleet.models import Server
from app.fleet.selectors import UnknownModel, request_lora
from app.prompts.services import FamilyKey, FamilySighting, prefix_families_seen
from collectors.records import RequestFacts


def record_families(located: Sequence[tuple[Server, RequestFacts]]) -> list[tuple[int, int | None] | None]:
    """The prefix family of each record, as (id, id of the template it is bound to); None for a
    record with template metadata, or whose prefix family cannot be known (`family_key`). One
    statement for the batch, made when new (prompts.services.prefix_families_seen)."""
    keys = [family_key(server, item) for server, item in located]
    sightings: dict[FamilyKey, FamilySighting] = {}
    for (server, item), found in zip(located, keys, strict=True):
        if found is None:
            continue
        (model, size, key), blocks = found
        seen = sightings.get((model, size, key))
        if seen is None:
            sightings[model, size, key] = FamilySighting(
                model, size, key, blocks, item.arrived_at, item.arrived_at, 1, server.pk, item.request_id
            )
        else:
            sightings[model, size, key] = replace(
                seen, first_seen_at=min(seen.first_seen_at, item.arrived_at),
                last_seen_at=max(seen.last_seen_at, item.arrived_at), requests=seen.requests + 1,
            )  # fmt: skip
    known = prefix_families_seen(list(sightings.values()))
    return [known[found[0]] if found else None for found in keys]


def family_key(server: Server, item: RequestFacts) -> tuple[FamilyKey, int] | None:
    """The identity of a record's prefix family, and the blocks its key covers: the model (the
    server's when the record names none) and block size, and the salt-neutral hash of its first
    PREFIXSCOPE_FAMILY_BLOCKS full blocks, or of its last full block when it has fewer. Only those
    blocks are hashed here; the whole chain is hashed as the COPY takes the row (services/requests.py).

    None with template metadata, without token ids, a known block size or a full block, and for a
    model the server does not serve (its chain is not stored either)."""
    size = server.block_size
    if item.template or item.prompt_token_ids is None or not size:
        return None
    blocks = min(settings.PREFIXSCOPE_FAMILY_BLOCKS, len(item.prompt_token_ids) // size)
    if not blocks:
        return None
    try:
        lora = request_lora(server, item.model)
    except UnknownModel:
        return None
    # Token ids beyond int64 are hashed too (blockhash's cbor2 path): the ingest refuses their batch later.
    leading = signed_block_hashes(item.prompt_token_ids[: blocks * size], size, lora=lora)
    return (item.model or server.model, size, leading[-1]), blocks
