"""A trace's independent parts: requests whose diagnoses cannot depend on one another's.

A request's diagnosis (app/domain/misscauses.py) reads what earlier requests left in two kinds of
memory: by block (what was seen, resident, under which salt) and by template (its earlier
prompts, where they part, the text they shared; requests without a template are one family).
Every block's key covers all the tokens before it, so two chains that share any block share their
first, salt-neutral, block: requests joined by neither a first block nor a template never read
what the other wrote, and histories of their own diagnose them as one history would.

That holds while nothing is evicted (an unlimited cache): with a capacity, one request's blocks
push another's out of the pool they share, and the trace is one part.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from app.domain.replay.trace import TraceRequest


def independent_parts(requests: Sequence[TraceRequest], most: int) -> list[list[int]]:
    """The requests' indices in at most `most` parts, each in arrival order, no two parts joined
    by a first block or a template, the largest first; balanced by prompt tokens (the largest
    group of joined requests goes to the part holding the fewest tokens so far)."""
    groups = _joined(requests)
    tokens = {root: sum(requests[i].prompt_tokens for i in members) for root, members in groups.items()}
    parts: list[list[int]] = [[] for _ in range(min(most, len(groups)))]
    held = [0] * len(parts)
    for root in sorted(groups, key=lambda root: -tokens[root]):
        fewest = held.index(min(held))
        parts[fewest].extend(groups[root])
        held[fewest] += tokens[root]
    return [sorted(part) for _, part in sorted(zip(held, parts, strict=True), key=lambda p: -p[0])]


def _joined(requests: Sequence[TraceRequest]) -> dict[int, list[int]]:
    """Each group of requests joined by a shared first block or template, by its first request."""
    parent = list(range(len(requests)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    first_of: dict[Hashable, int] = {}  # a first block or a template -> the first request with it
    for index, request in enumerate(requests):
        for key in _keys(request):
            joined = first_of.setdefault(key, index)
            if joined != index:
                parent[root(index)] = root(joined)
    groups: dict[int, list[int]] = {}
    for index in range(len(requests)):
        groups.setdefault(root(index), []).append(index)
    return groups


def _keys(request: TraceRequest) -> list[Hashable]:
    """What joins the request to others: its template (None for the family of those without
    one), its first block, and that block without the salt when known."""
    keys: list[Hashable] = [("template", request.template or None)]
    keys.extend(("block", chain[0]) for chain in (request.block_hashes, request.unsalted_hashes) if chain)
    return keys
