"""The search for killers over the prefix tree: which nodes fan out, what that costs, and where."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from app.domain.blockhash import int64_ids
from app.domain.blocks import reusable_tokens
from app.domain.killers.shared_text import index_shared_text, shared_stretch
from app.domain.killers.text import decoded_windows, per_user, text_class, window_samples
from app.domain.killers.tree import Tree, evenly
from app.domain.killers.values import (
    SUGGESTIONS,
    Decode,
    Ints,
    Killer,
    KillerClass,
    KillerSettings,
    Prompt,
    Straddle,
)


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


class Search:
    """The state of one ``find_killers`` call: which requests an accepted killer already accounts for."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        block_size: int,
        tree: Tree,
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
        after the position, with earlier requests of other branches (``shared_stretch``); in hash-only mode,
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
        klass, samples, sample_requests = self._classify(node, position, cost, affected)
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
            sample_requests=sample_requests,
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
        sampled = candidates[evenly(len(candidates), s.evaluated_requests)]
        floors = np.maximum(self.tree.seen[node.requests[sampled]], node.depth) * size
        if not self.token_mode:
            lost = np.maximum(self.tree.blocks[node.requests[sampled]] * size - floors, 0)
            return _Cost(sampled, lost, np.zeros(len(sampled), dtype=np.int64), np.zeros(0, dtype=np.int64))
        start = self._divergence(node, np.ones(len(node.requests), dtype=bool))
        pool = np.union1d(candidates[evenly(len(candidates), s.pool_requests)], self._branch_firsts(node))
        text = index_shared_text(
            [self.tokens(int(node.requests[i]))[start:] for i in pool], node.children[pool], pool, s
        )
        lost, ends = [], []
        for i, floor in zip(sampled.tolist(), floors.tolist(), strict=True):
            tokens = self.tokens(int(node.requests[i]))
            end = start + shared_stretch(tokens[start:], text, int(node.children[i]), i, s)
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
    ) -> tuple[KillerClass, tuple[str, ...], tuple[int, ...]]:
        """The class (per-user from the tree alone; the others from decoded windows of affected
        requests), the samples and the requests they come from (without text, a few affected ones)."""
        s = self.settings
        tenants = [self.prompts[int(r)].tenant for r in node.requests.tolist()]
        by_tenant = per_user(tenants, node.children.tolist(), s.min_continuations)
        klass = KillerClass.PER_USER if by_tenant else None
        hit = node.requests[cost.sampled[affected]]
        if position is None or self.decode is None:
            return klass or KillerClass.UNCLASSIFIED, (), tuple(hit[evenly(len(hit), s.max_samples)].tolist())
        reach = cost.ends[affected] - position
        width = min(max(int(np.median(reach)) + s.gram_tokens, 64), s.max_window_tokens)
        chosen = hit[evenly(len(hit), s.classified_requests)]
        token_lists = [self.tokens(int(r)) for r in chosen]
        windows = decoded_windows(token_lists, position, width, self.decode, s)
        found = window_samples(windows, s)
        samples = tuple(sample for sample, _ in found)
        return klass or text_class(windows), samples, tuple(int(chosen[i]) for _, i in found)
