"""Templates, prefix families and their cache killers in a trace, as the server finds them.

A request's template is what the trace names; one without is in the prefix family of its first
FAMILY_BLOCKS full blocks (their salt-neutral key, per model), as the server's ingest files it
(app/traffic/services/families.py). Killers are searched as the server's task does
(app/compare/killers.py): per template, per salt and model, on its most recent KILLER_MAX_REQUESTS
requests in arrival order, token mode where every one has its token ids, the killers' text decoded
with the bundled GPT-2 tokenizer. Prefix families are searched the same way (the server searches
templates only).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TypeAlias

from app.analyzer.trace import Built, ints
from app.domain import gpt2
from app.domain.killers import Killer, Prompt, find_killers
from app.domain.replay.trace import TraceRequest

FAMILY_BLOCKS = 4  # the server's PREFIXSCOPE_FAMILY_BLOCKS default
KILLER_MAX_REQUESTS = 2000  # the server's PREFIXSCOPE_KILLER_MAX_REQUESTS default


@dataclass(frozen=True, slots=True)
class Group:
    """A template, or a prefix family of requests without one."""

    kind: str  # "template" or "family"
    name: str


@dataclass(frozen=True, slots=True)
class FoundKiller:
    """A killer of one group's requests (one salt and model)."""

    group: Group
    salt: str
    model: str
    killer: Killer
    sample_request_ids: tuple[str, ...]


def group_of(request: TraceRequest, block_size: int) -> Group | None:
    """The request's template, else its prefix family; None without either (no full block known)."""
    if request.template:
        return Group("template", request.template)
    chain = request.unsalted_hashes if request.salt else request.block_hashes
    blocks = min(FAMILY_BLOCKS, len(chain), request.prompt_tokens // block_size)
    if not blocks:
        return None
    key = ints(chain)[blocks - 1]
    return Group("family", f"{request.group or 'prefix'}-{key & 0xFFFFFFFF:08x}")


KillerGroup: TypeAlias = tuple[Group, str, str]  # a group, a salt and a model: what a search is of


def killer_groups(built: Built) -> list[tuple[KillerGroup, list[int]]]:
    """Each template's (and prefix family's) requests under one salt and model, a search each."""
    grouped: dict[KillerGroup, list[int]] = defaultdict(list)
    for index, request in enumerate(built.requests):
        group = group_of(request, built.block_size)
        if group is not None:
            grouped[(group, request.salt, request.group)].append(index)
    return sorted(grouped.items(), key=lambda item: repr(item[0]))


def group_killers(built: Built, key: KillerGroup, indices: list[int]) -> list[FoundKiller]:
    """The killers of one group's most recent requests."""
    group, salt, model = key
    recent = [i for i in indices if built.requests[i].block_hashes][-KILLER_MAX_REQUESTS:]
    return [
        FoundKiller(group, salt, model, killer, tuple(built.requests[recent[i]].request_id
                                                      for i in killer.sample_requests))
        for killer in _search(built, recent)
    ]  # fmt: skip


def costliest(found: list[FoundKiller]) -> list[FoundKiller]:
    return sorted(found, key=lambda k: (-k.killer.tokens_lost, k.group.name, k.killer.position_block))


def _search(built: Built, indices: list[int]) -> tuple[Killer, ...]:
    token_mode = all(built.token_ids[i] is not None for i in indices)
    prompts = [
        Prompt(
            block_hashes=ints(built.requests[i].block_hashes),  # the tree reads them in one pass
            token_ids=built.token_ids[i] if token_mode else None,
            tenant=built.requests[i].tenant or None,
        )
        for i in indices
    ]
    if not prompts:
        return ()
    return find_killers(prompts, built.block_size, decode=gpt2.text_of if token_mode else None)
