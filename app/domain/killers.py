"""Cache killers: where one template's (or family's) traffic fans out, what it costs, and what varies there.

A killer is a node of the prompts' prefix tree (the block-hash chains: equal hash at block i means equal
tokens up to the end of block i) where requests that share the prefix so far continue in many ways, and
where those continuations would have shared more had the varying text been stable. The cost model is the
funnel's "seen before" step: an unlimited cache, requests in arrival order. A request loses to a killer
the full blocks it would have reused from an earlier request had the varying span been stable, minus what
it reused anyway (``_Search.evaluate`` has the exact definitions). So a variation at the tail of a prompt
costs nothing (nothing cacheable follows it), a value with a few alternatives costs a few first requests,
and several templates interleaved are not a killer at token 0: each template re-converges only with
itself, never across the fan-out.

Token mode (every prompt has its token ids) gives the exact token, the text-shared stretch after it and,
with a ``decode`` callable, samples of the varying text and a class. Hash-only mode (no token ids) gives
the block, and its only class is per-user data, which the hashes alone show. It cannot see text after
the varying span, so its cost counts every full block after it, an upper bound: a request's own tail
(a user message) longer than ``min_tokens_lost`` tokens reads there as a cost, which token mode tells
apart. Nor can it see that another template mixed in differs from a fan-out, so it uses the tree's
shape instead (``_Search._fresh``).

Prompts must share one compatibility record (model, adapter, salt): blocks of different salts never
share, so the caller groups by salt first. Samples are prompt text: return them only where the viewer may
read prompts, and never log them.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import chain
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from app.domain.blockhash import TokenIds, int64_ids, wire_to_signed
from app.domain.blocks import reusable_tokens

Decode: TypeAlias = Callable[[Sequence[int]], str]
"""Token ids to text: a server's /detokenize or the configured tokenizer, passed in by the caller."""

Ints: TypeAlias = npt.NDArray[np.int64]


class KillerClass(StrEnum):
    """What kind of text varies at a killer."""

    TIMESTAMP = "timestamp"
    ID = "id"
    NUMBER = "number"
    REORDERED_ITEMS = "reordered_items"
    JSON_KEY_ORDER = "json_key_order"
    WHITESPACE_DRIFT = "whitespace_drift"
    PER_USER = "per_user"
    ROTATING_EXAMPLES = "rotating_examples"
    VARYING_TEXT = "varying_text"  # text was seen, and it is none of the above
    UNCLASSIFIED = "unclassified"  # no text to look at: hash-only mode, or no decoder


SUGGESTIONS: Final[dict[KillerClass, str]] = {
    KillerClass.TIMESTAMP: "Move the timestamp below the stable part of the prompt, or round it to the hour.",
    KillerClass.ID: "Move the request or trace id out of the prompt, or below its stable part.",
    KillerClass.NUMBER: "Move the changing number below the stable part of the prompt.",
    KillerClass.REORDERED_ITEMS: "Sort the items (tools, retrieved chunks) by a stable key before rendering.",
    KillerClass.JSON_KEY_ORDER: "Serialize the JSON with sort_keys=True and fixed separators.",
    KillerClass.WHITESPACE_DRIFT: "Normalize whitespace (trailing spaces, blank lines) before rendering.",
    KillerClass.PER_USER: "Move the per-user data below the shared part, or into the user message.",
    KillerClass.ROTATING_EXAMPLES: "Use one fixed set of examples, or move them below the stable part.",
    KillerClass.VARYING_TEXT: "Move the varying text below the stable part of the prompt.",
    KillerClass.UNCLASSIFIED: "Read the text at this block (hash-only mode has none); move what varies down.",
}
"""One plain suggestion per class."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's prompt, as stored: its block-hash chain (one hash per full block, all signed int64 or
    all uint64 wire values), its token ids when retention keeps them, and its tenant (or user). Lists or
    1-D integer arrays."""

    block_hashes: TokenIds
    token_ids: TokenIds | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class KillerSettings:
    """The thresholds of ``find_killers``; the defaults suit block sizes of 16 to 32.

    A node is a killer when its requests branch there and reach ``min_continuations`` distinct nodes
    ``fanout_window_blocks`` blocks further on (a cascade of two-way choices counts as many ways), at
    least ``min_requests`` of them are affected (lose a block or more), also ``min_affected_share`` of
    the requests through it, and these lose ``min_tokens_lost`` tokens each on average. Only requests
    whose first block unseen in earlier requests lies within ``fanout_window_blocks`` of the node count.
    Token mode: text is "shared structure" when a gram of ``gram_tokens`` tokens of it appears after the
    position in two or more of the node's branches; a request re-converges at its first covered
    run of ``min_stretch_tokens`` and the stretch goes on over gaps up to ``max_gap_tokens``. A divergence
    ``straddle_margin_tokens`` or fewer tokens before a block boundary is a straddle. Costs are measured on
    ``evaluated_requests`` evenly spaced requests (scaled up beyond), shared structure on ``pool_requests``,
    classes on ``classified_requests`` decoded windows of at most ``max_window_tokens`` (plus
    ``lead_tokens`` before the node). ``max_samples`` samples of at most ``sample_chars`` characters.
    Per-user data needs ``min_continuations`` tenants, each taking its own branch.
    """

    min_continuations: int = 3
    min_requests: int = 8
    min_affected_share: float = 0.02
    min_tokens_lost: int = 64
    fanout_window_blocks: int = 8
    gram_tokens: int = 8
    min_stretch_tokens: int = 32
    max_gap_tokens: int = 16
    straddle_margin_tokens: int = 4
    evaluated_requests: int = 256
    pool_requests: int = 64
    classified_requests: int = 24
    max_window_tokens: int = 1024
    lead_tokens: int = 64
    max_samples: int = 5
    sample_chars: int = 80


@dataclass(frozen=True, slots=True)
class Straddle:
    """A divergence just before a block boundary: the ``shared_tokens`` of block ``block_index`` before it
    are identical in every request and recomputed anyway, since vLLM caches whole blocks only."""

    block_index: int
    shared_tokens: int
    block_size: int


@dataclass(frozen=True, slots=True)
class Killer:
    """A fan-out position and its cost. ``position_token`` is None in hash-only mode.

    ``requests_through``: requests sharing the prefix up to the position (less those an earlier killer
    accounts for); ``distinct_continuations``: the distinct nodes they reach ``fanout_window_blocks``
    blocks further on (or at their last block); ``requests_affected`` (losing a block or more) and
    ``tokens_lost``: what the fan-out costs, estimates scaled up from ``evaluated_requests`` requests
    when more are concerned. ``samples``: short texts of the varying line, empty without text.
    """

    position_token: int | None
    position_block: int
    requests_through: int
    requests_affected: int
    distinct_continuations: int
    tokens_lost: int
    klass: KillerClass
    suggestion: str
    samples: tuple[str, ...]
    straddle: Straddle | None


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
    tree = _build_tree(prompts)
    search = _Search(prompts, block_size, tree, decode, chosen)
    killers = [killer for node in _candidates(tree, chosen) if (killer := search.evaluate(*node)) is not None]
    return tuple(sorted(killers, key=lambda k: (-k.tokens_lost, k.position_block)))


@dataclass(frozen=True, slots=True)
class _Tree:
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
    them)."""
    chains = chain.from_iterable(p.block_hashes for p in prompts)
    try:
        return np.fromiter(chains, dtype=np.int64, count=total)
    except OverflowError:
        signed = (wire_to_signed(value) for p in prompts for value in p.block_hashes)
        return np.fromiter(signed, dtype=np.int64, count=total)


def _build_tree(prompts: Sequence[Prompt]) -> _Tree:
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
    return _Tree(request, depth, node, first, count, branches, members, member_start, blocks, seen, offsets)


def _candidates(tree: _Tree, settings: KillerSettings) -> list[tuple[int, Ints, Ints]]:
    """Every node where requests branch, shallowest first: (depth in blocks, its requests in arrival
    order, their next node or -1 where a request has no further full block). The root is at depth 0."""
    nodes = np.arange(len(tree.first))
    wide = nodes[(tree.branches >= 2) & (tree.count >= settings.min_requests)]
    wide = wide[np.argsort(tree.depth[tree.first[wide]], kind="stable")]
    has_blocks = tree.blocks > 0
    root = (0, np.flatnonzero(has_blocks).astype(np.int64), tree.node[tree.offsets[has_blocks]])
    return [root, *(_members(tree, int(u)) for u in wide)]


def _members(tree: _Tree, u: int) -> tuple[int, Ints, Ints]:
    start = int(tree.member_start[u])
    elements = tree.members[start : start + int(tree.count[u])]
    requests = tree.request[elements]
    has_child = tree.depth[elements] + 1 < tree.blocks[requests]
    following = tree.node[np.minimum(elements + 1, len(tree.node) - 1)]
    return int(tree.depth[elements[0]]) + 1, requests, np.where(has_child, following, -1)


def _evenly(size: int, most: int) -> Ints:
    """Indices of at most ``most`` evenly spaced items of ``size``, first and last included."""
    if size <= most:
        return np.arange(size, dtype=np.int64)
    return np.unique(np.linspace(0, size - 1, most).round().astype(np.int64))


@dataclass(frozen=True, slots=True)
class _Node:
    """A candidate node with what is not claimed yet: its ``requests`` (arrival order), their next
    node (``children``, -1 for none) and where they are ``fanout_window_blocks`` further (``ahead``)."""

    depth: int
    requests: Ints
    children: Ints
    ahead: Ints


@dataclass(frozen=True, slots=True)
class _Cost:
    """What a node's fan-out costs its ``sampled`` requests (positions in ``_Node.requests``): ``lost``
    tokens each, the token where each one's shared stretch ends (``ends``, token mode), and the
    branches whose text the fan-out shares (``related``, token mode)."""

    sampled: Ints
    lost: Ints
    ends: Ints
    related: Ints


_CLAIMED_SHARE: Final = 0.25


class _Search:
    """The state of one ``find_killers`` call: which requests an accepted killer already accounts for."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        block_size: int,
        tree: _Tree,
        decode: Decode | None,
        settings: KillerSettings,
    ) -> None:
        self.prompts = prompts
        self.block_size = block_size
        self.tree = tree
        self.decode = decode
        self.settings = settings
        self.token_mode = bool(prompts) and all(p.token_ids is not None for p in prompts)
        self.claimed = np.zeros(len(prompts), dtype=bool)

    def tokens(self, request: int) -> Ints:
        ids = self.prompts[request].token_ids
        return np.zeros(0, dtype=np.int64) if ids is None or not len(ids) else int64_ids(ids)

    def evaluate(self, depth: int, requests: Ints, children: Ints) -> Killer | None:
        """The killer at this node, or None; an accepted killer claims what it accounts for.

        Counted are the requests through the node whose first block unseen in earlier requests lies
        within ``fanout_window_blocks`` of it (``_fresh``). Each loses ``R - max(seen, depth) *
        block_size`` tokens, ``seen`` being the leading blocks an earlier request had and R, in token
        mode, the reusable tokens (``blocks.reusable_tokens``) up to the end of the stretch it shares,
        after the position, with earlier requests of other branches (``_stretch``); in hash-only mode,
        all of its full blocks.
        """
        s = self.settings
        node = self._node(depth, requests, children)
        if node is None:
            return None
        fresh = self._fresh(node)
        if int(fresh.sum()) < s.min_requests:
            return None
        cost = self._cost(node, fresh)
        scale = int(fresh.sum()) / len(cost.sampled)
        affected = cost.lost >= self.block_size
        requests_affected = round(int(affected.sum()) * scale)
        tokens_lost = round(int(cost.lost.sum()) * scale)
        if (
            requests_affected < max(s.min_requests, s.min_affected_share * len(node.requests))
            or tokens_lost < s.min_tokens_lost * requests_affected
        ):
            return None
        position = self._position(node, cost, affected)
        self._claim(node, fresh, cost.sampled[affected], scale)
        klass, samples = self._classify(node, position, cost, affected)
        return Killer(
            position_token=position,
            position_block=depth,
            requests_through=len(node.requests),
            requests_affected=requests_affected,
            distinct_continuations=int(np.unique(node.ahead[node.ahead >= 0]).size),
            tokens_lost=tokens_lost,
            klass=klass,
            suggestion=SUGGESTIONS[klass],
            samples=samples,
            straddle=self._straddle(depth, position),
        )

    def _node(self, depth: int, requests: Ints, children: Ints) -> _Node | None:
        """The node's unclaimed part, when its requests still branch there into enough continuations."""
        free = ~self.claimed[requests]
        requests, children = requests[free], children[free]
        ahead = self._continuations(depth, requests, children)
        branches = np.unique(children[children >= 0]).size
        if len(requests) < self.settings.min_requests or branches < 2:
            return None
        if np.unique(ahead[ahead >= 0]).size < self.settings.min_continuations:
            return None
        return _Node(depth, requests, children, ahead)

    def _continuations(self, depth: int, requests: Ints, children: Ints) -> Ints:
        """Where each request is ``fanout_window_blocks`` blocks past the node (or at its last block):
        a fan-out of many small steps (two ways at each of five lines) shows there as many ways."""
        reach = np.minimum(depth + self.settings.fanout_window_blocks, self.tree.blocks[requests] - 1)
        element = self.tree.offsets[requests] + np.maximum(reach, 0)
        return np.where(children >= 0, self.tree.node[np.minimum(element, len(self.tree.node) - 1)], -1)

    def _fresh(self, node: _Node) -> npt.NDArray[np.bool_]:
        """The requests the node's fan-out may cost: they diverge from every earlier request within
        ``fanout_window_blocks`` of it, before their last full block. Hash-only mode leaves out those on
        a branch that is a family of its own below (another template mixed in, which only text could
        otherwise tell apart): some full block on their way is not a branching point, the branch alone
        holds ``min_requests`` such requests, enough to be judged at its own nodes, and fewer than
        ``min_continuations`` branches are like it (more are the node's own fan-out: a JSON object's
        first keys)."""
        window = self.settings.fanout_window_blocks
        seen = self.tree.seen[node.requests]
        fresh = (node.children >= 0) & (seen >= node.depth) & (seen <= node.depth + window)
        fresh &= seen < self.tree.blocks[node.requests]
        if self.token_mode:
            return fresh
        columns = node.depth + np.arange(window)
        elements = np.minimum(self.tree.offsets[node.requests][:, None] + columns, len(self.tree.node) - 1)
        unbranched = (self.tree.branches[self.tree.node[elements]] < 2) & (columns < (seen - 1)[:, None])
        settled = fresh & unbranched.any(axis=1)
        branches, counts = np.unique(node.children[settled], return_counts=True)
        own = branches[counts >= self.settings.min_requests]
        if len(own) >= self.settings.min_continuations:
            return fresh  # they are too many to be families of their own: the node fans out into them
        family: npt.NDArray[np.bool_] = settled & np.isin(node.children, own)
        return fresh & ~family

    def _cost(self, node: _Node, fresh: npt.NDArray[np.bool_]) -> _Cost:
        size, s = self.block_size, self.settings
        candidates = np.flatnonzero(fresh)
        sampled = candidates[_evenly(len(candidates), s.evaluated_requests)]
        floors = np.maximum(self.tree.seen[node.requests[sampled]], node.depth) * size
        if not self.token_mode:
            lost = np.maximum(self.tree.blocks[node.requests[sampled]] * size - floors, 0)
            return _Cost(sampled, lost, np.zeros(len(sampled), dtype=np.int64), np.zeros(0, dtype=np.int64))
        start = self._divergence(node, np.ones(len(node.requests), dtype=bool))
        pool = np.union1d(candidates[_evenly(len(candidates), s.pool_requests)], self._branch_firsts(node))
        text = _shared_text(
            [self.tokens(int(node.requests[i]))[start:] for i in pool], node.children[pool], pool, s
        )
        lost, ends = [], []
        for i, floor in zip(sampled.tolist(), floors.tolist(), strict=True):
            tokens = self.tokens(int(node.requests[i]))
            end = start + _stretch(tokens[start:], text, int(node.children[i]), i, s)
            ends.append(end)
            lost.append(max(0, reusable_tokens(end, len(tokens), size) - floor))
        return _Cost(sampled, np.array(lost, dtype=np.int64), np.array(ends, dtype=np.int64), text.related)

    def _branch_firsts(self, node: _Node) -> Ints:
        """The first request of each branch that several take (an older version, another tenant): the
        earliest text later requests could have reused, fresh or not."""
        branches, firsts, counts = np.unique(node.children, return_index=True, return_counts=True)
        kept = firsts[(branches >= 0) & (counts >= 2)]
        return np.sort(kept)[: self.settings.pool_requests].astype(np.int64)

    def _divergence(self, node: _Node, among: npt.NDArray[np.bool_]) -> int:
        """The first token of the node's block where the branches of the ``among`` requests differ."""
        size = self.block_size
        children = np.where(among, node.children, -1)
        _, firsts = np.unique(children, return_index=True)
        kept = firsts[children[firsts] >= 0]
        if not len(kept):
            return node.depth * size
        rows = np.stack([self._block(int(node.requests[i]), node.depth) for i in kept])
        equal = (rows == rows[0]).all(axis=0)
        return node.depth * size + (size if bool(equal.all()) else int(np.argmin(equal)))

    def _block(self, request: int, depth: int) -> Ints:
        ids = self.prompts[request].token_ids
        block = [] if ids is None else ids[depth * self.block_size : (depth + 1) * self.block_size]
        return np.asarray(block, dtype=np.int64)

    def _position(self, node: _Node, cost: _Cost, affected: npt.NDArray[np.bool_]) -> int | None:
        """Token mode: where the branches that take part in the fan-out differ (the affected requests'
        and those sharing text with them, such as an older version), not another template mixed in."""
        if not self.token_mode:
            return None
        taking_part = np.union1d(cost.related, node.children[cost.sampled[affected]])
        return self._divergence(node, np.isin(node.children, taking_part))

    def _claim(self, node: _Node, fresh: npt.NDArray[np.bool_], affected: Ints, scale: float) -> None:
        """Claim what this killer accounts for, so that no deeper node counts it again: the requests it
        counted (``fresh``, the unsampled ones included: the estimate covers them), and the continuations
        where at least ``_CLAIMED_SHARE`` of the requests are affected (estimated from the sample, whose
        ``affected`` positions are given). A continuation mostly unaffected (an older template version,
        one tenant's later requests) stays open to deeper killers."""
        sizes = Counter(node.ahead.tolist())
        hits = Counter(node.ahead[affected].tolist())
        taken = [ahead for ahead, n in hits.items() if n * scale >= _CLAIMED_SHARE * sizes[ahead]]
        self.claimed[node.requests[np.isin(node.ahead, taken)]] = True
        self.claimed[node.requests[fresh]] = True

    def _straddle(self, depth: int, position: int | None) -> Straddle | None:
        if position is None:
            return None
        shared = position - depth * self.block_size
        if shared == 0 or self.block_size - shared > self.settings.straddle_margin_tokens:
            return None
        return Straddle(block_index=depth, shared_tokens=shared, block_size=self.block_size)

    def _classify(
        self, node: _Node, position: int | None, cost: _Cost, affected: npt.NDArray[np.bool_]
    ) -> tuple[KillerClass, tuple[str, ...]]:
        """The class (per-user from the tree alone; the others from decoded windows of affected
        requests) and the samples."""
        s = self.settings
        tenants = [self.prompts[int(r)].tenant for r in node.requests.tolist()]
        per_user = _per_user(tenants, node.children.tolist(), s.min_continuations)
        klass = KillerClass.PER_USER if per_user else None
        if position is None or self.decode is None:
            return klass or KillerClass.UNCLASSIFIED, ()
        reach = cost.ends[affected] - position
        width = min(max(int(np.median(reach)) + s.gram_tokens, 64), s.max_window_tokens)
        chosen = cost.sampled[affected][_evenly(int(affected.sum()), s.classified_requests)]
        token_lists = [self.tokens(int(r)) for r in node.requests[chosen]]
        windows = _windows(token_lists, position, width, self.decode, s)
        return klass or _text_class(windows), _samples(windows, s)


_GRAM_BASE: Final = np.uint64(0x100000001B3)
_NEVER: Final = np.iinfo(np.int64).max


def _grams(tokens: Ints, width: int) -> npt.NDArray[np.uint64]:
    """A hash of every run of ``width`` consecutive tokens (empty when there are fewer tokens)."""
    count = len(tokens) - width + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    values = tokens.astype(np.uint64)
    grams = np.zeros(count, dtype=np.uint64)
    for offset in range(width):
        grams = grams * _GRAM_BASE + values[offset : offset + count]  # wraps around: a hash
    return grams


@dataclass(frozen=True, slots=True)
class _SharedText:
    """The grams of a pool of tails (sorted), each with the branch and arrival position of its first
    request and the arrival position of its first request in another branch (``_NEVER`` for none), and
    the branches whose text other branches mostly share (``related``)."""

    grams: npt.NDArray[np.uint64]
    first_branch: Ints
    first_at: Ints
    other_at: Ints
    related: Ints


def _shared_text(tails: list[Ints], branches: Ints, arrivals: Ints, settings: KillerSettings) -> _SharedText:
    """Index the pool's tails (the tokens from the node's first difference on), which requests are
    given in arrival order (``arrivals``) with their branches (next blocks)."""
    grams = [_grams(tail, settings.gram_tokens) for tail in tails]
    lengths = [len(g) for g in grams]
    values = np.concatenate(grams) if grams else np.zeros(0, dtype=np.uint64)
    owners, at = np.repeat(branches, lengths), np.repeat(arrivals, lengths)
    order = np.lexsort((at, values))
    values, owners, at = values[order], owners[order], at[order]
    new = np.concatenate(([True], values[1:] != values[:-1])) if len(values) else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(new)
    gram = np.cumsum(new) - 1
    other = np.flatnonzero(owners != owners[starts][gram])
    other_at = np.full(len(starts), _NEVER, dtype=np.int64)
    found, first_other = np.unique(gram[other], return_index=True)
    other_at[found] = at[other[first_other]]  # rows of a gram come in arrival order
    return _SharedText(
        values[starts], owners[starts], at[starts], other_at, _related(owners, other_at[gram] < _NEVER)
    )


def _related(owners: Ints, shared: npt.NDArray[np.bool_]) -> Ints:
    """The branches at least half of whose grams another branch has too: the same text in another
    version or order. A few common phrases (two JSON schemas' ``{"type": "string"}``) do not count."""
    branches, index = np.unique(owners, return_inverse=True)
    share = np.bincount(index, weights=shared, minlength=len(branches)) / np.bincount(
        index, minlength=len(branches)
    )
    return branches[share >= 0.5]


def _stretch(tail: Ints, text: _SharedText, branch: int, arrival: int, settings: KillerSettings) -> int:
    """How far into ``tail`` (a request's tokens from the node's first difference on) runs the text it
    shares with an earlier request of another branch.

    A token is shared when such a gram covers it. The stretch starts at the first covered run of
    ``min_stretch_tokens`` (the varying span before it may be of any length), goes on over gaps of at
    most ``max_gap_tokens``, and ends with the last covered token before a longer gap. 0 when the tail
    never re-converges: a variation at the end of a prompt, another template, the first request.
    """
    grams = _grams(tail, settings.gram_tokens)
    if not len(grams) or not len(text.grams):
        return 0
    found = np.minimum(np.searchsorted(text.grams, grams), len(text.grams) - 1)
    earlier = np.where(text.first_branch[found] != branch, text.first_at[found], text.other_at[found])
    shared = (text.grams[found] == grams) & (earlier < arrival)
    return _covered_reach(shared, len(tail), settings)


def _covered_reach(shared: npt.NDArray[np.bool_], length: int, settings: KillerSettings) -> int:
    """``_stretch`` from the shared grams: where the covered runs that start with a long one end."""
    hits = np.zeros(length + 1, dtype=np.int64)
    hits[1 : len(shared) + 1] = np.cumsum(shared)
    hits[len(shared) + 1 :] = hits[len(shared)]
    lower = np.maximum(np.arange(length) - settings.gram_tokens + 1, 0)
    covered = np.flatnonzero(hits[1:] - hits[lower] > 0)
    if not len(covered):
        return 0
    breaks = np.flatnonzero(np.diff(covered) > 1)
    starts = covered[np.concatenate(([0], breaks + 1))]
    ends = covered[np.concatenate((breaks, [len(covered) - 1]))] + 1
    long_runs = np.flatnonzero(ends - starts >= settings.min_stretch_tokens)
    if not len(long_runs):
        return 0
    first = int(long_runs[0])
    wide_gaps = np.flatnonzero(starts[first + 1 :] - ends[first:-1] > settings.max_gap_tokens)
    last = first + int(wide_gaps[0]) if len(wide_gaps) else len(ends) - 1
    return int(ends[last])


def _per_user(tenants: Sequence[str | None], children: Sequence[int], least: int) -> bool:
    """Whether the continuation is a function of the tenant that tells tenants apart: every tenant's
    requests take one continuation, no two tenants share one, and at least ``least`` tenants (two of
    them with repeat requests) take part."""
    by_tenant: dict[str, set[int]] = {}
    by_child: dict[int, set[str]] = {}
    requests: Counter[str] = Counter()
    for tenant, child in zip(tenants, children, strict=True):
        if tenant is not None and child >= 0:
            by_tenant.setdefault(tenant, set()).add(child)
            by_child.setdefault(child, set()).add(tenant)
            requests[tenant] += 1
    repeat = sum(1 for n in requests.values() if n > 1)
    one_to_one = all(len(v) == 1 for v in by_tenant.values()) and all(len(v) == 1 for v in by_child.values())
    return one_to_one and len(by_tenant) >= least and repeat >= 2


@dataclass(frozen=True, slots=True)
class _Window:
    """One request's decoded text around the position: ``lead`` (up to the start of the position's line),
    ``text`` (from that line's start on) and ``varying``, the offset in ``text`` where the windows of the
    sampled requests start to differ."""

    lead: str
    text: str
    varying: int

    @property
    def lines(self) -> list[str]:
        """The complete lines of ``text`` (its last line is cut by the window)."""
        return self.text.split("\n")[:-1]

    @property
    def varying_line(self) -> int:
        """The index, in ``lines``, of the line where the windows start to differ."""
        return self.text.count("\n", 0, self.varying)


def _windows(
    token_lists: list[Ints], position: int, width: int, decode: Decode, settings: KillerSettings
) -> list[_Window]:
    """Decode ``lead_tokens`` before the position (once: every request has them) and ``width`` tokens
    from it, for each request; one ``decode`` call per request, plus one."""
    start = max(0, position - settings.lead_tokens)
    lead = decode(token_lists[0][start:position].tolist()) if start < position else ""  # shared by all
    line_start = lead.rfind("\n") + 1
    texts = [decode(tokens[start : position + width].tolist())[line_start:] for tokens in token_lists]
    varying = max(_common_prefix(texts), len(lead) - line_start)
    return [_Window(lead[:line_start], text, varying) for text in texts]


def _common_prefix(texts: list[str]) -> int:
    """The length of the longest prefix every text has."""
    shortest, longest = min(texts), max(texts)  # the lexical extremes bound every common prefix
    size = next((i for i, (a, b) in enumerate(zip(shortest, longest, strict=False)) if a != b), None)
    return min(len(shortest), len(longest)) if size is None else size


def _samples(windows: list[_Window], settings: KillerSettings) -> tuple[str, ...]:
    """The distinct varying lines, cut to ``sample_chars`` around where they start to differ."""
    chars = settings.sample_chars
    found: list[str] = []
    for window in windows:
        line_start = window.text.rfind("\n", 0, window.varying) + 1
        line = window.text[line_start:].split("\n", 1)[0]
        offset = window.varying - line_start
        cut = 0 if len(line) <= chars or offset <= chars // 2 else offset - chars // 4
        sample = ("…" if cut else "") + line[cut : cut + chars]
        if sample not in found:
            found.append(sample)
    return tuple(found[: settings.max_samples])


def _text_class(windows: list[_Window]) -> KillerClass:
    """The class of the varying text, tried from the most specific: whitespace, JSON, line order,
    rotating examples, then what the varying value looks like."""
    if _whitespace_only(windows):
        return KillerClass.WHITESPACE_DRIFT
    if _same_json(windows):
        return KillerClass.JSON_KEY_ORDER
    common = _common_lines(windows)
    if _reordered(windows, common):
        return KillerClass.REORDERED_ITEMS
    if _rotating(windows, common):
        return KillerClass.ROTATING_EXAMPLES
    return _value_class(windows)


def _whitespace_only(windows: list[_Window], beyond: int = 128) -> bool:
    """Whether, whitespace collapsed, the windows agree ``beyond`` characters past where they split
    (or to the end of the shortest): only whitespace differed there."""
    bodies = [" ".join(w.text.rsplit("\n", 1)[0].split()) for w in windows]
    split = len(" ".join(windows[0].text[: windows[0].varying].split()))
    shortest = min(len(body) for body in bodies)
    return shortest > split and _common_prefix(bodies) >= min(shortest, split + beyond)


def _same_json(windows: list[_Window]) -> bool:
    """Whether the JSON object around the position is the same value in most windows, written apart."""
    forms = [form for w in windows if (form := _json_around(w)) is not None]
    return len(forms) >= max(2, 0.8 * len(windows)) and len(set(forms)) == 1


def _json_around(window: _Window, attempts: int = 32) -> str | None:
    text, target = window.lead + window.text, len(window.lead) + window.varying
    decoder = json.JSONDecoder()
    for match in list(re.finditer(r"\{", text[: target + 1]))[:attempts]:
        try:
            value, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict) and end > target:
            return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return None


def _common_lines(windows: list[_Window]) -> set[str]:
    """Non-blank lines present in at least 80% of the windows."""
    counts = Counter(line for w in windows for line in set(w.lines) if line.strip())
    return {line for line, n in counts.items() if n >= 0.8 * len(windows)}


def _line_at(window: _Window) -> str | None:
    lines = window.lines
    return lines[window.varying_line] if window.varying_line < len(lines) else None


def _reordered(windows: list[_Window], common: set[str]) -> bool:
    """The varying line is an item most windows have, and the items come in more than one order."""
    at_common = sum(1 for w in windows if _line_at(w) in common)
    orders = {tuple(line for line in dict.fromkeys(w.lines) if line in common) for w in windows}
    return len(common) >= 2 and at_common >= 0.8 * len(windows) and len(orders) >= 2


def _rotating(windows: list[_Window], common: set[str]) -> bool:
    """Several varying lines per window, and the varying line itself recurs: drawn from a small pool."""
    counts = Counter(line for w in windows for line in set(w.lines) if line.strip())
    varying = [[line for line in w.lines if line.strip() and line not in common] for w in windows]
    recurring = sum(1 for w in windows if (line := _line_at(w)) is not None and counts[line] >= 2)
    return sum(map(len, varying)) >= 2 * len(windows) and recurring * 2 >= len(windows)


_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_WEEKDAY = r"(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*,?"
_ZONE = r"(?:z|utc|gmt|[+-]\d{2}:?\d{2})"
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2})?"
_TIMESTAMPS = (
    rf"\d{{4}}-\d{{2}}-\d{{2}}(?:[t ]\d{{2}}:\d{{2}}(?::\d{{2}}(?:[.,]\d+)?)?\s?{_ZONE}?)?",  # ISO 8601
    rf"(?:{_WEEKDAY}\s+)?\d{{1,2}}\s+{_MONTH}\s+\d{{4}}(?:\s+{_CLOCK}\s*{_ZONE}?)?",  # RFC 2822
    rf"(?:{_WEEKDAY}\s+)?{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}(?:,?\s+{_CLOCK})?",  # Dec 1 2026
    rf"\b{_CLOCK}(?:[.,]\d+)?(?:\s?[ap]m)?\b",  # 12:03:44
    r"\b\d{1,2}/\d{1,2}/\d{2,4}\b",
    r"\b1[5-9]\d{8}(?:\d{3})?\b",  # epoch seconds or milliseconds, 2017 to 2033
)
_IDS = (
    r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b",  # uuid
    r"\b(?:request|trace|span|session|message|correlation|call)[ _-]?id\b\W{0,3}[^\s|,;]+",  # labelled
    r"\b(?:req|trace|span|msg|sess|run|job|txn|corr|call|chatcmpl|evt)[-_:][a-z0-9][a-z0-9_-]{3,}",
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{8,}\b",  # hex
    r"(?-i:\b(?=[\w+/-]*\d)(?=[\w+/-]*[A-Z])(?=[\w+/-]*[a-z])[\w+/-]{16,}={0,2})",  # base64-ish
)
_VALUE_PATTERNS: Final = (
    (KillerClass.TIMESTAMP, re.compile("|".join(_TIMESTAMPS), re.IGNORECASE)),
    (KillerClass.ID, re.compile("|".join(_IDS), re.IGNORECASE)),
    (KillerClass.NUMBER, re.compile(r"[-+]?\d+(?:[.,]\d+)*")),
)


def _value_class(windows: list[_Window]) -> KillerClass:
    """Vote over the windows: the value pattern whose match covers the varying offset of its line, or
    else starts nearest after it; of equal matches, timestamp before id before number."""
    votes: Counter[KillerClass] = Counter()
    for window in windows:
        # Around the varying offset only: a prompt without newlines would make its line the window.
        line_start = max(window.text.rfind("\n", 0, window.varying) + 1, window.varying - 64)
        line = window.text[line_start : window.varying + 256].split("\n", 1)[0]
        offset = window.varying - line_start
        found = [
            (0 if match.start() <= offset < match.end() else 1, match.start(), rank, klass)
            for rank, (klass, pattern) in enumerate(_VALUE_PATTERNS)
            for match in pattern.finditer(line)
            if match.end() > offset
        ]
        if found:
            votes[min(found)[3]] += 1
    if not votes or votes.most_common(1)[0][1] * 2 < len(windows):
        return KillerClass.VARYING_TEXT
    return votes.most_common(1)[0][0]
