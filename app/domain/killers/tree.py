"""The prefix tree of a window's block chains, flat in numpy arrays, and the nodes where it branches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from app.domain.blockhash import wire_to_signed
from app.domain.killers.values import Ints, KillerSettings, Prompt


@dataclass(frozen=True, slots=True)
class Tree:
    """The prefix tree of the block chains, flat: one element per (prompt, block), in arrival order.

    ``node`` numbers each distinct hash (a tree node: the prefix up to and including that block) and
    ``branches`` counts each node's next blocks; ``members`` lists the elements node by node
    (``member_start``), in arrival order; ``seen`` is, per prompt, how many leading blocks an earlier
    prompt had (the chain makes them a prefix).
    """

    request: Ints
    depth: Ints
    node: Ints
    first: Ints
    count: Ints
    branches: Ints
    members: Ints
    member_start: Ints
    blocks: Ints
    seen: Ints
    offsets: Ints


def _flat_hashes(prompts: Sequence[Prompt], total: int) -> Ints:
    """Every prompt's chain, end to end, as int64 (uint64 wire values mapped as a bigint column stores
    them). Arrays are joined as they are: read one element at a time, each would be a numpy scalar."""
    if all(isinstance(p.block_hashes, np.ndarray) and p.block_hashes.dtype == np.int64 for p in prompts):
        return np.concatenate([p.block_hashes for p in prompts]) if prompts else np.zeros(0, np.int64)
    chains = chain.from_iterable(p.block_hashes for p in prompts)
    try:
        return np.fromiter(chains, dtype=np.int64, count=total)
    except OverflowError:
        signed = (wire_to_signed(value) for p in prompts for value in p.block_hashes)
        return np.fromiter(signed, dtype=np.int64, count=total)


def build_tree(prompts: Sequence[Prompt]) -> Tree:
    blocks = np.array([len(p.block_hashes) for p in prompts], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(blocks)[:-1])).astype(np.int64) if len(prompts) else blocks
    flat = _flat_hashes(prompts, int(blocks.sum()))
    request = np.repeat(np.arange(len(prompts), dtype=np.int64), blocks)
    depth = np.arange(len(flat), dtype=np.int64) - np.repeat(offsets, blocks)
    members = np.argsort(flat, kind="stable").astype(np.int64)
    ordered = flat[members]
    new = np.concatenate(([True], ordered[1:] != ordered[:-1])) if len(flat) else np.zeros(0, dtype=bool)
    member_start = np.flatnonzero(new).astype(np.int64)
    node = np.empty(len(flat), dtype=np.int64)
    node[members] = np.cumsum(new) - 1
    first = members[member_start]
    count = np.diff(np.append(member_start, len(flat))).astype(np.int64)
    below_root = first[depth[first] > 0]
    branches = np.bincount(node[below_root - 1], minlength=len(first)).astype(np.int64)
    repeated = np.ones(len(flat), dtype=bool)
    repeated[first] = False
    seen = np.bincount(request, weights=repeated, minlength=len(prompts)).astype(np.int64)
    return Tree(request, depth, node, first, count, branches, members, member_start, blocks, seen, offsets)


def candidates(tree: Tree, settings: KillerSettings) -> list[tuple[int, Ints, Ints]]:
    """Every node where requests branch, shallowest first: (depth in blocks, its requests in arrival
    order, their next node or -1 where a request has no further full block). The root is at depth 0."""
    nodes = np.arange(len(tree.first))
    wide = nodes[(tree.branches >= 2) & (tree.count >= settings.min_requests)]
    wide = wide[np.argsort(tree.depth[tree.first[wide]], kind="stable")]
    has_blocks = tree.blocks > 0
    root = (0, np.flatnonzero(has_blocks).astype(np.int64), tree.node[tree.offsets[has_blocks]])
    return [root, *(_members(tree, int(u)) for u in wide)]


def _members(tree: Tree, u: int) -> tuple[int, Ints, Ints]:
    start = int(tree.member_start[u])
    elements = tree.members[start : start + int(tree.count[u])]
    requests = tree.request[elements]
    has_child = tree.depth[elements] + 1 < tree.blocks[requests]
    following = tree.node[np.minimum(elements + 1, len(tree.node) - 1)]
    return int(tree.depth[elements[0]]) + 1, requests, np.where(has_child, following, -1)


def evenly(size: int, most: int) -> Ints:
    """Indices of at most ``most`` evenly spaced items of ``size``, first and last included."""
    if size <= most:
        return np.arange(size, dtype=np.int64)
    return np.unique(np.linspace(0, size - 1, most).round().astype(np.int64))
