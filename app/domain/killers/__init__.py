"""Cache killers: where one template's (or family's) traffic fans out, what it costs, and what varies there.

A killer is a node of the prompts' prefix tree (the block-hash chains: equal hash at block i means equal
tokens up to the end of block i) where requests that share the prefix so far continue in many ways, and
where those continuations would have shared more had the varying text been stable. The cost model is the
funnel's "seen before" step: an unlimited cache, requests in arrival order. A request loses to a killer
the full blocks it would have reused from an earlier request had the varying span been stable, minus what
it reused anyway (``Search.evaluate`` has the exact definitions). So a variation at the tail of a prompt
costs nothing (nothing cacheable follows it), a value with a few alternatives costs a few first requests,
and several templates interleaved are not a killer at token 0: each template re-converges only with
itself, never across the fan-out.

Token mode (every prompt has its token ids) gives the exact token, the text-shared stretch after it and,
with a ``decode`` callable, samples of the varying text and a class. Hash-only mode (no token ids) gives
the block, and its only class is per-user data, which the hashes alone show. It cannot see text after
the varying span, so its cost counts every full block after it, an upper bound: a request's own tail
(a user message) longer than ``min_tokens_lost`` tokens reads there as a cost, which token mode tells
apart. Nor can it see that another template mixed in differs from a fan-out, so it uses the tree's
shape instead (``Search._fresh``).

Prompts must share one compatibility record (model, adapter, salt): blocks of different salts never
share, so the caller groups by salt first. Samples are prompt text: return them only where the viewer may
read prompts, and never log them; ``Killer.sample_requests`` names the prompts they come from, and
``sample_texts`` decodes them again later.

The modules: ``values`` (what goes in and comes out), ``tree`` (the prefix tree), ``search`` (fan-out,
cost, position), ``shared_text`` (where token mode sees requests re-converge) and ``text`` (samples and
classes from decoded windows).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.killers.search import Search
from app.domain.killers.text import sample_texts
from app.domain.killers.tree import build_tree, candidates
from app.domain.killers.values import (
    SUGGESTIONS,
    Decode,
    Killer,
    KillerClass,
    KillerSettings,
    Prompt,
    Straddle,
)

__all__ = [
    "SUGGESTIONS",
    "Decode",
    "Killer",
    "KillerClass",
    "KillerSettings",
    "Prompt",
    "Straddle",
    "find_killers",
    "sample_texts",
]


def find_killers(
    prompts: Sequence[Prompt],
    block_size: int,
    *,
    decode: Decode | None = None,
    settings: KillerSettings | None = None,
) -> tuple[Killer, ...]:
    """The cache killers of ``prompts`` (one compatibility record, arrival order), costliest first.

    Token mode when every prompt has token ids, else hash-only mode. Several templates may be mixed: the
    tree splits them, and a killer is looked for in each. Under a killer, the continuations it affects are
    not searched again (a second volatile value behind the first costs nothing until the first is fixed).
    Prompts shorter than one block take no part. No prompts, no killers. ``decode`` is called only for
    killers, on at most ``classified_requests`` windows each. Raises ValueError when block_size <= 0.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    chosen = settings or KillerSettings()
    tree = build_tree(prompts)
    search = Search(prompts, block_size, tree, decode, chosen)
    killers = [killer for node in candidates(tree, chosen) if (killer := search.evaluate(*node)) is not None]
    return tuple(sorted(killers, key=lambda k: (-k.tokens_lost, k.position_block)))
