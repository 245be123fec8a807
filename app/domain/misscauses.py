"""Why a request's prompt tokens were not reused: its miss causes, block by block, and its funnel.

The fleet's KV events and the requests are replayed in time order (`FleetHistory`): events move
blocks in and out of each server's resident set (app/domain/fleetblocks.py keeps where every block
is), and each request is diagnosed here against the fleet as it was at its arrival, then adds its
own chain to what the fleet has seen. Pure: the caller reads events and records from wherever they
are kept and feeds them in order of time.

vLLM reuses a request's longest run of resident leading full blocks, never its last prompt token, so
of `prompt_tokens` at most `(prompt_tokens - 1) // block_size` blocks can be reused; on a server whose
effective block is larger (a hybrid model's KV-cache groups, EAGLE/MTP dropping the last matched
block: app/domain/hitblock.py) only whole effective blocks of those. The tokens past them are
`below_block`. Each block that was not reused has its cause (a prompt can be evicted up to
token 512 and changed from there on), except that one still resident here was lost only because the
chain broke before it: it takes the cause of the block before it. The request's cause is the one that
lost it the most reusable tokens, the earlier of equal ones: a timestamp at the top whose first block
a request of another tenant happened to share is lost mostly to the prompt change, not to the salt.

A block that was not reused is, in this order of checks:
- `unexplained`: resident on this server at arrival, the first block lost: the engine had it and did
  not reuse it (event lag, engine behaviour); counted on its own, never folded into another cause;
- `no_kv_events`: the server's KV events are not collected, so eviction, routing and residency cannot
  be told apart (only what needs no events is said: salt, prompt changed, cold);
- `demoted`: removed from this server's GPU memory, but a lower tier of it (CPU, disk, LMCache: a
  KV event with another `medium`, or a removal whose reason said demoted) still held it:
  reloadable, and not reused (a block the engine reloaded from there was reused: vLLM counts the
  tokens its connector loads as cached);
- `evicted`: stored on this server in its current epoch and removed before the request from every
  tier (when, and how long it had lived);
- `routed_elsewhere`: resident at that moment on another server of the same compatibility group
  (which one, and how many of the prompt's leading tokens it held);
- `restarted`: held by this server in an earlier epoch (a restart emptied it);
- `evicted` too when it was stored elsewhere and is gone everywhere (the fleet computed it once);
- `salt`: never seen under the request's salt, but the same tokens were seen under another salt
  (the salt-neutral chain, computed at ingest while the token ids were in hand);
- `prompt_changed`: never seen, and the prompt's template had earlier requests under this salt (a
  prompt without one: earlier prompts without one): the prompt departs from their longest prefix at
  token `diverged_at`; a prompt without a template that shares not even its first token is cold;
- `cold`: never seen anywhere, the first of its kind.
Which events count for residency (a server's attention group, its GPU tier, removal reasons):
app/domain/fleetblocks.py.

An `unexpected_hit` is the reverse anomaly: more tokens reused than the request's own salted chain
had resident on its server (salts are known to be dropped on some cache paths), and than earlier
requests under its salt had sent: a request just before it on its server, whose blocks were stored
while this one waited, is in its KV events only after this one's arrival.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from app.domain.evictions import Eviction
from app.domain.familiar import FamiliarText
from app.domain.fanout import FanOutPoints
from app.domain.fleetblocks import BlockEvent, EventKind, FleetBlocks
from app.domain.followers import Followers
from app.domain.generations import Generations
from app.domain.leading import leading
from app.domain.lossruns import (
    BlockCause,
    evicted_while_waiting,
    loss_runs,
    main_cause,
    new_content_after,
    within_hit_units,
)
from app.domain.misses import Cause, Diagnosis, Funnel, Loss, Unknown
from app.domain.partchanges import FamilyParts
from app.domain.requestprompt import RequestPrompt


def _funnel(
    prompt: int, cached: int, size: int, *, seen_before: int, anywhere: int, here: int, reused: int
) -> Funnel:
    """The funnel from the blocks each step holds. What vLLM reused was resident on its server at
    arrival, whatever the KV events said by then (a request just before it may have stored those
    blocks, their events timed after this arrival): each step takes the engine's word, so that it
    holds the next (reused <= here <= anywhere <= seen before) and a share of one never passes 1."""
    here = max(here, reused)
    anywhere = max(anywhere, here)
    return Funnel(
        prompt_tokens=prompt,
        seen_before=max(seen_before, anywhere) * size,
        resident_anywhere=anywhere * size,
        resident_here=here * size,
        reused=cached,
    )


class FleetHistory:
    """The fleet's resident blocks and what it has seen, replayed in time order.

    `apply` each event and `diagnose` each request in order of time (events at or before a request's
    arrival first). Servers are compared only within their compatibility group (`groups`: server ->
    any key; servers not listed form a group of their own). `attention`: server -> the KV-cache
    group its prefix is reused from (app/domain/tiers.py attention_group; servers not listed: 0).
    """

    def __init__(
        self, groups: dict[int, Hashable] | None = None, attention: dict[int, int] | None = None
    ) -> None:
        self._groups = dict(groups or {})
        self._blocks = FleetBlocks(attention)  # where each block is, as the events left it
        self._seen = self._blocks.seen  # stored, or in a diagnosed request's chain
        # What was seen forgets, by generations (`turn`): these grow with the traffic, not the caches.
        self._neutral_salts: Generations[int, str] = Generations()  # neutral block -> a salt seen with it
        self._families: dict[tuple[Hashable, str], Followers] = {}
        # The text each family's prompts shared, under any salt: a template that turns volatile
        # under a salt it never had healthy (a tenant's rotation) is told by its other salts' text.
        self._texts: dict[Hashable, FamiliarText] = {}
        self._fan_out = FanOutPoints()  # where each family's prompts usually part
        self._parts = FamilyParts()  # which part of a changed request changed
        # Requests whose first lost block was resident at arrival, until their first token: the
        # block removed meanwhile (other requests took its place while it waited) was evicted.
        self._waiting: dict[tuple[int, int], list[tuple[RequestPrompt, Diagnosis]]] = {}
        self.revised: dict[Hashable, Diagnosis] = {}  # by request key: diagnoses events changed since

    @property
    def generation_blocks(self) -> int:
        """Blocks seen since the last `turn`."""
        return len(self._seen.new)

    def turn(self) -> None:
        """Forget what was seen, evicted or salted and not seen again since the last turn: a
        history kept between runs would otherwise grow with every new prompt for as long as it runs.
        A block older than that is then never seen (cold, or its prompt changed), not evicted."""
        self._blocks.turn()
        self._fan_out.turn()
        self._neutral_salts.turn()

    def regroup(self, groups: dict[int, Hashable], attention: dict[int, int] | None = None) -> None:
        """New compatibility groups (a server registered, or its model read) and attention groups
        (a server's events named their kinds), for what follows."""
        self._groups = dict(groups)
        self._blocks.attention = dict(attention or {})

    def forget_settled(self, before: datetime) -> None:
        """Forget the revisions taken, and the requests waiting for a first token before `before`:
        a history kept between runs holds only what a later event can still change."""
        self.revised.clear()
        for key, waiting in list(self._waiting.items()):
            kept = [(r, d) for r, d in waiting if r.first_token_at is not None and r.first_token_at >= before]
            if kept:
                self._waiting[key] = kept
            else:
                del self._waiting[key]

    # -- events ---------------------------------------------------------------------------------

    def apply(self, event: BlockEvent) -> None:
        """One block of a KV event. A new epoch of a (server, rank) empties what it held."""
        hashes = (event.block_hash,) if event.block_hash is not None else ()
        self.apply_blocks(event.server, event.rank, event.epoch, event.at, event.kind, hashes,
                          medium=event.medium, group=event.group, reason=event.reason)  # fmt: skip

    def apply_blocks(
        self, server: int, rank: int, epoch: int, at: datetime, kind: EventKind, hashes: Sequence[int],
        *, medium: str = "", group: int | None = None, reason: int | None = None,
    ) -> None:  # fmt: skip
        """The blocks of one KV event at once (as `apply` each, in order): an event stores or
        removes dozens, and a call per block cost more than what it does. Which count, and how:
        app/domain/fleetblocks.py FleetBlocks.apply_blocks."""
        removed = self._blocks.apply_blocks(server, rank, epoch, at, kind, hashes,
                                            medium=medium, group=group, reason=reason)  # fmt: skip
        if removed is not None and self._waiting:
            for block, stored in dict(zip(removed.blocks, removed.stored_at, strict=True)).items():
                self._revise_waiting(server, block, (server, stored, removed.at))  # the last of a block

    def resident(self, server: int) -> Mapping[int, datetime]:
        """What the server holds in GPU memory as the events applied so far left it (block -> when
        stored), kept up to date: for a caller that asks it of every request it replays."""
        return self._blocks.resident.setdefault(server, {})

    # -- requests -------------------------------------------------------------------------------

    def diagnose(self, request: RequestPrompt) -> Diagnosis | Unknown:
        """Why the request's prompt tokens were not reused, against the fleet at its arrival; then
        its chain joins what the fleet has seen (the request computed and stored it)."""
        unknown = request.unknown()
        if unknown is not None:
            return unknown
        assert request.block_size is not None and request.prompt_tokens is not None
        assert request.cached_tokens is not None
        diagnosis = self._diagnosed(request, request.block_size, request.prompt_tokens, request.cached_tokens)
        if diagnosis.losses and diagnosis.losses[0].cause == Cause.UNEXPLAINED and request.first_token_at:
            block = request.block_hashes[diagnosis.losses[0].first_token // request.block_size]
            self._waiting.setdefault((request.server, block), []).append((request, diagnosis))
        self.remember(request, departure_learned=True)
        return diagnosis

    def _revise_waiting(self, server: int, block: int, eviction: Eviction) -> None:
        """A block removed while requests that found it resident waited for their first token: it
        was evicted for them (their `revised` diagnosis), not unexplained."""
        for request, diagnosis in self._waiting.pop((server, block), []):
            assert request.first_token_at is not None
            if eviction[2] <= request.first_token_at:  # removed before it
                self.revised[request.key] = evicted_while_waiting(diagnosis, eviction)

    def _diagnosed(self, request: RequestPrompt, size: int, prompt: int, cached: int) -> Diagnosis:
        chain = list(request.block_hashes)
        reusable = min(request.hit_block(size).reusable_blocks(prompt), len(chain))
        reused = min(cached // size, reusable)
        runs = self._runs(request, chain[:reusable])  # its own server's among them
        resident_here = runs.get(request.server, 0)
        seen_before = self._seen.leading(chain[:reusable])
        funnel = _funnel(prompt, cached, size, seen_before=seen_before, anywhere=_best(runs)[1],
                         here=resident_here, reused=reused)  # fmt: skip
        causes = self._block_causes(request, chain, range(reused, reusable), size)
        per_hit = request.hit_block(size).effective // size
        losses = loss_runs(
            within_hit_units(causes, first_block=reused, per_hit=per_hit), first_block=reused, size=size
        )
        # Where the family's earlier prompts part (none before its first departure), then this one.
        if (point := self._fan_out.point(request.family)) is not None:
            losses = new_content_after(losses, point)
        self._learn_fan_out(request, reusable, seen_before)
        tail = prompt - max(reusable, reused) * size
        if tail > 0:
            losses.append(Loss(Cause.BELOW_BLOCK, first_token=prompt - tail, tokens=tail))
        diverged = None  # the same for every block of the request: computed once
        if any(loss.cause == Cause.PROMPT_CHANGED for loss in losses):
            family = self._families[(request.family, request.salt)]
            diverged = family.divergence(chain, request.token_ids, size)
            if diverged == 0 and request.family is None:
                # Without a template, earlier prompts are only other prompts: one sharing not
                # even its first token with them is new, not changed.
                losses = [replace(loss, cause=Cause.COLD) if loss.cause == Cause.PROMPT_CHANGED else loss
                          for loss in losses]  # fmt: skip
                diverged = None
        found = Diagnosis(
            cause=main_cause(losses, reusable=reusable),
            diverged_at=diverged,
            losses=tuple(losses),
            funnel=funnel,
            unexpected_hit=request.kv_events and reused > max(resident_here, seen_before),
        )
        return self._parts.named(request, chain, found) if diverged is not None else found

    def _block_causes(
        self, request: RequestPrompt, chain: list[int], lost: range, size: int
    ) -> list[BlockCause]:
        """The cause of each lost block. Once one was never seen under any salt, the blocks after it
        that were not either have its cause (`_never_seen` says the same of them: the family is the
        request's), so only that is checked of them: a prompt's new tail is most of its blocks."""
        causes: list[BlockCause] = []
        unseen: BlockCause | None = None
        for index in lost:
            block = chain[index]
            if unseen is not None and block not in self._seen and not self._salted_elsewhere(request, index):
                causes.append(unseen)
                continue
            found = self._block_cause(request, chain, index, size)
            causes.append(found)
            if found.cause in (Cause.PROMPT_CHANGED, Cause.COLD) and block not in self._seen:
                unseen = found
                rest = range(index + 1, lost.stop)
                if self._all_unknown(request, chain, rest):  # the common new tail: no step per block
                    causes.extend([unseen] * len(rest))
                    break
        return causes

    def _all_unknown(self, request: RequestPrompt, chain: list[int], blocks: range) -> bool:
        """Whether none of the chain's `blocks` was seen, nor its tokens under any salt: then none
        is seen nor salted elsewhere (`_block_causes` would check each)."""
        if not blocks:
            return True
        keys = chain[blocks.start : blocks.stop]
        neutral = request.neutral_hashes[blocks.start : blocks.stop] if request.salt else keys
        salts = self._neutral_salts
        return (
            self._seen.new.keys().isdisjoint(keys)
            and self._seen.old.keys().isdisjoint(keys)
            and salts.new.keys().isdisjoint(neutral)
            and salts.old.keys().isdisjoint(neutral)
        )

    def _block_cause(self, request: RequestPrompt, chain: list[int], index: int, size: int) -> BlockCause:
        block = chain[index]
        server = request.server
        blocks = self._blocks
        if block in blocks.resident.get(server, {}):
            return BlockCause(Cause.UNEXPLAINED, here=True)
        if block not in self._seen:
            return self._never_seen(request, chain, index, size)
        if not request.kv_events:
            return BlockCause(Cause.NO_KV_EVENTS)
        evicted = blocks.eviction(server, block)
        if blocks.lower.holder(server, block) is not None:
            return (
                BlockCause.evicted(evicted, Cause.DEMOTED)
                if evicted
                else BlockCause(Cause.DEMOTED, server=server)
            )
        if evicted:
            return BlockCause.evicted(evicted)
        other, held = self._best_server(request, chain, exclude=server)
        if other is not None and held > index:
            return BlockCause(Cause.ROUTED_ELSEWHERE, server=other, server_tokens=held * size)
        if block in blocks.earlier_epochs.get(server, ()):
            return BlockCause(Cause.RESTARTED)
        if last := blocks.last_removed.get(block):
            return BlockCause.evicted(last)
        if blocks.resident_anywhere(block):
            return BlockCause(Cause.COLD)  # only servers of another compatibility group hold it
        return BlockCause(Cause.NO_KV_EVENTS)  # seen in a record of a server whose events are not collected

    def _never_seen(self, request: RequestPrompt, chain: list[int], index: int, size: int) -> BlockCause:
        if self._salted_elsewhere(request, index):
            return BlockCause(Cause.SALT)
        if (request.family, request.salt) not in self._families:
            return BlockCause(Cause.COLD)
        return BlockCause(Cause.PROMPT_CHANGED)

    def _salted_elsewhere(self, request: RequestPrompt, index: int) -> bool:
        """Whether the block's tokens (its salt-neutral hash) were seen under another salt."""
        if request.salt:
            if index >= len(request.neutral_hashes):
                return False
            neutral = request.neutral_hashes[index]
        else:
            neutral = request.block_hashes[index]
        other_salt = self._neutral_salts.get(neutral)
        return other_salt is not None and other_salt != request.salt

    def _best_server(
        self, request: RequestPrompt, chain: list[int], *, exclude: int | None = None
    ) -> tuple[int | None, int]:
        """The compatible server holding the longest run of the chain's leading blocks, and the run."""
        return _best(self._runs(request, chain, exclude=exclude))

    def _runs(
        self, request: RequestPrompt, chain: list[int], *, exclude: int | None = None
    ) -> dict[int, int]:
        """The run of the chain's leading blocks each compatible server holds (that holds its first)."""
        if not chain:
            return {}
        group = self._groups.get(request.server, ("alone", request.server))
        return {
            server: leading(chain, resident)
            for server, resident in self._blocks.resident.items()
            if server != exclude
            and chain[0] in resident
            and self._groups.get(server, ("alone", server)) == group
        }

    def remember(self, request: RequestPrompt, *, departure_learned: bool = False) -> None:
        """Add a request's chain to what the fleet has seen, without diagnosing it (one diagnosed
        before, replayed for the history it leaves), and where it departed, unless already learned."""
        chain = list(request.block_hashes)
        if not departure_learned and request.block_size and request.prompt_tokens is not None:
            reusable = min(
                request.hit_block(request.block_size).reusable_blocks(request.prompt_tokens), len(chain)
            )
            self._learn_fan_out(request, reusable, self._seen.leading(chain[:reusable]))
        self._blocks.write_seen(chain)
        neutral = list(request.neutral_hashes) if request.salt else chain
        self._neutral_salts.setdefault_all(neutral, request.salt)
        family = self._families.get((request.family, request.salt))
        if family is None:  # the template's text is one under every salt (FamiliarText)
            text = self._texts.setdefault(request.family, FamiliarText())
            family = self._families[(request.family, request.salt)] = Followers(text)
        family.remember(chain, request.token_ids, request.block_size or 0)
        self._parts.remember(request, chain)

    def _learn_fan_out(self, request: RequestPrompt, reusable: int, seen_before: int) -> None:
        """Where the request departed from what was seen before under its salt (`seen_before` of its
        `reusable` blocks), when it shared some leading full blocks and not all, and went on with
        content of its own. A prompt that goes on with the text its family's earlier prompts shared
        under any salt (app/domain/familiar.py, wherever a volatile span of its own length shifted
        it) departed at
        a volatile token (a timestamp, a request id), not where its family's prompts part, and
        teaches nothing of that point; else a template left volatile at its top for a generation
        would call its whole system prompt new content."""
        if not 0 < seen_before < reusable:
            return
        assert request.block_size is not None
        text = self._texts.get(request.family)
        departed_at = seen_before * request.block_size
        point = self._fan_out.point(request.family)
        early = point is None or departed_at < point  # at or past it, its prompts part there anyway
        if early and text is not None and text.familiar(request.token_ids, departed_at):
            self._fan_out.departed_volatile(request.family)
            return
        self._fan_out.departed(request.family, departed_at)


def _best(runs: dict[int, int]) -> tuple[int | None, int]:
    """The server of the longest run (the lowest of equal ones) and its run; (None, 0) for none."""
    best: tuple[int | None, int] = (None, 0)
    for server, run in runs.items():
        if run > best[1] or (run == best[1] and best[0] is not None and server < best[0]):
            best = (server, run)
    return best
