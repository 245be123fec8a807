"""The CPU offload tier behind a simulated engine: what it publishes and what it loads back."""

from collections.abc import Callable

from collectors.kv_events.parse import BlockRemoved, BlockStored, decode_batch
from simulator.cache import PrefixCache
from simulator.kv_events import encode_batch
from simulator.offload import CpuTier

SIZE = 4


def prompt(seed: int, blocks: int = 4) -> list[int]:
    return [seed * 1000 + i for i in range(blocks * SIZE + 1)]


def cache(**tier: object) -> PrefixCache:
    return PrefixCache(SIZE, 6, lower=CpuTier(100, **tier))  # type: ignore[arg-type]  # 5 usable blocks


def serve(cache: PrefixCache, seed: int, name: str) -> int:
    cached = cache.admit(name, prompt(seed)).cached_tokens
    cache.finish(name)
    return cached


def decoded(cache: PrefixCache) -> list[object]:
    payload = encode_batch(1.0, cache.take_events(), 0)
    return list(decode_batch(payload).events)


def of(kind: type, medium: str) -> Callable[[object], bool]:
    return lambda e: isinstance(e, kind) and e.medium == medium  # type: ignore[attr-defined]


def test_blocks_evicted_from_gpu_are_published_as_cpu_copies_the_collector_decodes() -> None:
    engine = cache()
    serve(engine, 1, "a")
    serve(engine, 2, "b")  # takes the first prompt's blocks
    events = decoded(engine)
    gpu_removed = [e for e in events if of(BlockRemoved, "GPU")(e)]
    cpu_stored = [e for e in events if of(BlockStored, "CPU")(e)]
    assert gpu_removed and len(cpu_stored) == len(gpu_removed)
    assert {e.block_hashes for e in cpu_stored} == {e.block_hashes for e in gpu_removed}  # type: ignore[attr-defined]
    assert all(e.block_size == 0 and not e.token_ids for e in cpu_stored)  # type: ignore[attr-defined]


def test_a_prompt_whose_blocks_went_to_cpu_is_served_from_there_and_counted_cached() -> None:
    engine = cache()
    serve(engine, 1, "a")
    serve(engine, 2, "b")
    assert serve(engine, 1, "a2") == 4 * SIZE  # all four reusable blocks: GPU's and the CPU's
    assert engine.counters.external_hits > 0


def test_a_tier_whose_lookups_fail_holds_the_blocks_and_the_engine_recomputes_them() -> None:
    engine = cache(reload=False)
    serve(engine, 1, "a")
    serve(engine, 2, "b")
    assert serve(engine, 1, "a2") < 4 * SIZE
    assert engine.counters.external_hits == 0


def test_a_full_tier_drops_its_oldest_copy_with_a_cpu_removal() -> None:
    tier = CpuTier(1)

    class Key:  # any hashable with a wire value, as the pool's BlockHash
        def __init__(self, wire: int) -> None:
            self.wire = wire

    a, b = Key(1), Key(2)
    assert [e["type"] for e in tier.offload(a)] == ["BlockStored"]
    events = tier.offload(b)
    assert [(e["type"], e["block_hashes"], e["medium"]) for e in events] == [
        ("BlockRemoved", [1], "CPU"), ("BlockStored", [2], "CPU"),
    ]  # fmt: skip
    assert a not in tier and b in tier
