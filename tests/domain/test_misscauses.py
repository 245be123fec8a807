"""Miss causes block by block, on real sha256_cbor chains of prompts of real shape."""

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.blockhash import LoraKey, signed_block_hashes
from app.domain.fleetblocks import BlockEvent, EventKind
from app.domain.misscauses import FleetHistory
from app.domain.misses import Cause, Diagnosis, Loss, RequestPart, Unknown, reusable_blocks
from app.domain.requestparts import Parts
from app.domain.requestprompt import RequestPrompt
from app.domain.tiers import RemovalReason
from tests.support.leading_paths import LEADING_PATHS, use_leading_path


@pytest.fixture(autouse=True, params=LEADING_PATHS)
def leading_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: chains' leading blocks counted in Python, then in app/domain/_chain.c."""
    use_leading_path(request.param, monkeypatch)


SIZE = 16
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
rng = random.Random(7)
SYSTEM = [rng.randrange(50_000) for _ in range(160)]  # ten blocks of a shared system prompt


def prompt(tail: int = 40, *, seed: int = 0, changed_at: int | None = None) -> list[int]:
    """The shared system prompt, then a tail of its own; `changed_at`: one token there differs."""
    own = random.Random(seed)
    tokens = SYSTEM + [own.randrange(50_000) for _ in range(tail)]
    if changed_at is not None:
        tokens[changed_at] = (tokens[changed_at] + 1 + seed) % 50_000  # each seed its own change
    return tokens


def chain(tokens: list[int], salt: str | None = None) -> list[int]:
    return signed_block_hashes(tokens, SIZE, cache_salt=salt)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stored(history: FleetHistory, server: int, hashes: list[int], seconds: float, *, epoch: int = 0) -> None:
    for block in hashes:
        history.apply(BlockEvent(server, 0, epoch, at(seconds), EventKind.STORED, block))


def removed(history: FleetHistory, server: int, hashes: list[int], seconds: float) -> None:
    for block in hashes:
        history.apply(BlockEvent(server, 0, 0, at(seconds), EventKind.REMOVED, block))


def request(
    tokens: list[int], *, server: int = 1, seconds: float = 100, cached: int = 0, salt: str | None = None,
    family: str = "support", kv_events: bool = True, hash_only: bool = False,
) -> RequestPrompt:  # fmt: skip
    return RequestPrompt(
        server=server,
        arrived_at=at(seconds),
        block_size=SIZE,
        prompt_tokens=len(tokens),
        cached_tokens=cached,
        block_hashes=chain(tokens, salt),
        salt=salt or "",
        neutral_hashes=chain(tokens) if salt else (),
        family=family,
        token_ids=None if hash_only else tokens,
        kv_events=kv_events,
    )


def diagnosed(history: FleetHistory, found: RequestPrompt) -> Diagnosis:
    result = history.diagnose(found)
    assert isinstance(result, Diagnosis)
    return result


def test_the_first_prompt_of_its_kind_is_cold_and_its_last_partial_block_below_one_block() -> None:
    tokens = prompt(tail=40)  # 200 tokens: 12 full blocks, 8 tokens in a partial one
    found = diagnosed(FleetHistory(), request(tokens))
    assert found.cause == Cause.COLD
    assert found.losses == (Loss(Cause.COLD, 0, 192), Loss(Cause.BELOW_BLOCK, 192, 8))
    assert (found.funnel.seen_before, found.funnel.resident_here, found.funnel.reused) == (0, 0, 0)


def test_a_prompt_reused_up_to_its_last_full_block_has_no_cause() -> None:
    history = FleetHistory()
    tokens = prompt(tail=32)  # 192 tokens, block-aligned: the last block holds the last token
    stored(history, 1, chain(tokens), 10)
    found = diagnosed(history, request(tokens, cached=176))
    assert found.cause is None
    assert found.losses == (Loss(Cause.BELOW_BLOCK, 176, 16),)
    assert found.funnel.resident_here == found.funnel.seen_before == 176 == reusable_blocks(192, SIZE) * SIZE


def test_blocks_stored_here_and_removed_before_arrival_are_evicted_with_their_times() -> None:
    history = FleetHistory()
    tokens = prompt()
    hashes = chain(tokens)
    stored(history, 1, hashes, 10)
    removed(history, 1, hashes[4:], 50)  # tails are evicted first
    found = diagnosed(history, request(tokens, cached=4 * SIZE))
    assert found.cause == Cause.EVICTED
    assert found.losses[0] == Loss(Cause.EVICTED, 64, 8 * SIZE, server=1, stored_at=at(10), removed_at=at(50))
    assert found.funnel.seen_before == 192 and found.funnel.resident_here == 64


def test_a_block_evicted_that_was_stored_before_the_replay_began_is_evicted_all_the_same() -> None:
    history = FleetHistory()
    tokens = prompt()
    removed(history, 1, chain(tokens), 50)
    found = diagnosed(history, request(tokens))
    assert found.cause == Cause.EVICTED and found.losses[0].stored_at is None


def test_blocks_resident_on_another_compatible_server_were_routed_elsewhere() -> None:
    history = FleetHistory(groups={1: "tiny", 2: "tiny", 3: "other-model"})
    tokens = prompt()
    stored(history, 2, chain(tokens)[:7], 10)
    stored(history, 3, chain(tokens), 10)  # holds more, but another model's server
    found = diagnosed(history, request(tokens, server=1))
    assert found.cause == Cause.ROUTED_ELSEWHERE
    assert found.losses[0] == Loss(Cause.ROUTED_ELSEWHERE, 0, 7 * SIZE, server=2, server_tokens=7 * SIZE)
    assert found.losses[1] == Loss(Cause.COLD, 7 * SIZE, 5 * SIZE)  # only another model's server had them
    assert found.funnel.resident_anywhere == 7 * SIZE and found.funnel.resident_here == 0


def test_a_restart_turns_what_the_old_process_held_into_restarted() -> None:
    history = FleetHistory()
    tokens = prompt()
    stored(history, 1, chain(tokens), 10, epoch=0)
    stored(history, 1, chain(prompt(seed=9))[-1:], 60, epoch=1)  # the new process's first block
    found = diagnosed(history, request(tokens))
    assert found.cause == Cause.RESTARTED
    assert found.losses[0] == Loss(Cause.RESTARTED, 0, 12 * SIZE)


def test_the_same_tokens_under_another_salt_are_salt_not_cold_even_in_hash_only_mode() -> None:
    history = FleetHistory()
    tokens = prompt()
    first = request(tokens, salt="acme-2026", seconds=10, hash_only=True)
    history.diagnose(first)
    stored(history, 1, list(first.block_hashes), 11)
    found = diagnosed(history, request(tokens, salt="acme-2026-rotated", hash_only=True))
    assert found.cause == Cause.SALT and found.losses[0] == Loss(Cause.SALT, 0, 12 * SIZE)
    unsalted = diagnosed(history, request(tokens, seconds=120, hash_only=True))
    assert unsalted.cause == Cause.SALT  # the same tokens without a salt: seen under another


def test_a_changed_prompt_departs_at_the_exact_token_after_what_its_template_shared() -> None:
    history = FleetHistory()
    before = prompt(seed=1)
    history.diagnose(request(before, seconds=10))
    stored(history, 1, chain(before), 11)
    after = prompt(seed=2, changed_at=37)  # inside block 2: blocks 0 and 1 still shared
    found = diagnosed(history, request(after, cached=2 * SIZE))
    assert found.cause == Cause.PROMPT_CHANGED and found.diverged_at == 37
    assert found.losses[0] == Loss(Cause.PROMPT_CHANGED, 32, 10 * SIZE)
    # Again without token ids, in a history that knows only the first prompt (in this one, the
    # change above taught the template that its prompts part at token 32: past it is new content).
    blind = FleetHistory()
    blind.diagnose(request(before, seconds=10))
    stored(blind, 1, chain(before), 11)
    hash_only = diagnosed(blind, request(prompt(seed=3, changed_at=37), cached=2 * SIZE, hash_only=True))
    assert hash_only.diverged_at == 32  # block-exact without token ids


def test_a_changed_prompt_departs_from_the_earlier_prompt_sharing_the_most_not_the_latest() -> None:
    history = FleetHistory()
    older = prompt(seed=1)
    newer = [*older[:162], *prompt(seed=2)[162:]]  # 2 tokens of block 10 as the older one's
    for n, earlier in enumerate((older, newer)):
        history.diagnose(request(earlier, seconds=10 + n))
        stored(history, 1, chain(earlier), 10.5 + n)
    # Longer prompts repeating the older one whole: the template's prompts part after its 12 blocks.
    for seed in range(4, 14):
        own = [random.Random(seed).randrange(50_000) for _ in range(40)]
        history.diagnose(request([*older, *own], seconds=12 + seed / 100))
    later = [*older[:173], *prompt(seed=3)[173:]]  # 13 tokens of block 10 as the older one's
    found = diagnosed(history, request(later, cached=10 * SIZE))
    assert found.cause == Cause.PROMPT_CHANGED and found.diverged_at == 173


def test_another_template_with_the_same_tokens_is_not_a_changed_prompt() -> None:
    history = FleetHistory()
    history.diagnose(request(prompt(seed=1), family="billing", seconds=10))
    found = diagnosed(history, request(prompt(seed=2, changed_at=0), family="support"))
    assert found.cause == Cause.COLD


def test_a_block_resident_here_and_not_reused_is_unexplained_and_later_ones_follow_the_break() -> None:
    history = FleetHistory()
    tokens = prompt()
    hashes = chain(tokens)
    stored(history, 1, hashes, 10)
    found = diagnosed(history, request(tokens, cached=0))
    assert found.cause == Cause.UNEXPLAINED and found.losses[0] == Loss(Cause.UNEXPLAINED, 0, 12 * SIZE)
    removed(history, 1, hashes[3:4], 120)  # block 3 gone, blocks 4.. still resident
    found = diagnosed(history, request(tokens, seconds=130, cached=3 * SIZE))
    assert [(loss.cause, loss.tokens) for loss in found.losses] == [
        (Cause.EVICTED, 9 * SIZE),
        (Cause.BELOW_BLOCK, 8),
    ]


def test_without_kv_events_residency_is_not_guessed() -> None:
    history = FleetHistory()
    tokens = prompt()
    history.diagnose(request(tokens, seconds=10, kv_events=False))
    found = diagnosed(history, request(tokens, kv_events=False))
    assert found.cause == Cause.NO_KV_EVENTS
    changed = diagnosed(history, request(prompt(changed_at=0), seconds=110, kv_events=False))
    assert changed.cause == Cause.PROMPT_CHANGED  # a new prompt needs no events to be told


def test_more_reused_than_its_own_salt_had_resident_is_an_unexpected_hit() -> None:
    history = FleetHistory()
    tokens = prompt()
    stored(history, 1, chain(tokens, "globex"), 10)
    found = diagnosed(history, request(tokens, salt="acme", cached=10 * SIZE))
    assert found.unexpected_hit
    assert not diagnosed(history, request(tokens, salt="globex", cached=10 * SIZE)).unexpected_hit


def test_blocks_a_request_just_before_stored_while_it_waited_are_no_unexpected_hit() -> None:
    """Two requests of one salt on one server a few ms apart: the second reuses what the first
    stored, whose KV events are timed after the second's arrival."""
    history = FleetHistory()
    tokens = prompt()
    history.diagnose(request(tokens, salt="acme", seconds=100))
    second = diagnosed(history, request(tokens, salt="acme", seconds=100.01, cached=2 * SIZE))
    stored(history, 1, chain(tokens, "acme"), 100.05)
    # vLLM's word on what was resident here: the funnel's steps hold each other, events or not.
    assert (second.funnel.resident_here, second.funnel.resident_anywhere, second.funnel.reused) == (
        2 * SIZE,
    ) * 3
    assert not second.unexpected_hit
    # Under another salt, the same blocks reused are one still.
    assert diagnosed(history, request(tokens, salt="initech", seconds=101, cached=2 * SIZE)).unexpected_hit


@pytest.mark.parametrize(
    ("change", "unknown"),
    [
        ({"cached_tokens": None}, Unknown.NO_CACHED_TOKENS),
        ({"block_hashes": [], "token_ids": None}, Unknown.NO_PROMPT),
        ({"block_size": None}, Unknown.NO_BLOCK_SIZE),
    ],
)
def test_a_record_that_cannot_be_diagnosed_says_what_it_lacks(
    change: dict[str, object], unknown: Unknown
) -> None:
    assert FleetHistory().diagnose(replace(request(prompt()), **change)) == unknown  # type: ignore[arg-type]


def test_a_prompt_shorter_than_one_block_is_below_block_only() -> None:
    found = diagnosed(FleetHistory(), request(SYSTEM[:10]))
    assert found.cause == Cause.BELOW_BLOCK and found.losses == (Loss(Cause.BELOW_BLOCK, 0, 10),)


def test_the_requests_cause_is_the_one_that_lost_it_the_most_tokens() -> None:
    # A timestamp at the top: its first block, by chance, was also another tenant's (same second).
    history = FleetHistory()
    tokens = prompt()
    history.diagnose(request(tokens, seconds=10))  # unsalted
    stored(history, 1, chain(tokens), 11)
    history.diagnose(request(prompt(seed=5, changed_at=0), salt="acme", seconds=20))  # the template under it
    changed = prompt(seed=2, changed_at=20)  # block 1 differs
    found = diagnosed(history, request(changed, salt="acme"))
    assert [(loss.cause, loss.tokens) for loss in found.losses][:2] == [
        (Cause.SALT, 16),
        (Cause.PROMPT_CHANGED, 176),
    ]
    assert found.cause == Cause.PROMPT_CHANGED


def test_a_block_removed_while_the_request_waited_for_its_first_token_was_evicted() -> None:
    history = FleetHistory()
    tokens = prompt()
    hashes = chain(tokens)
    stored(history, 1, hashes, 10)
    waiting = replace(request(tokens, cached=0), first_token_at=at(100.5), key="waited")
    served = replace(request(tokens, cached=0), first_token_at=at(100.1), key="served before it")
    assert diagnosed(history, waiting).cause == diagnosed(history, served).cause == Cause.UNEXPLAINED
    removed(history, 1, hashes, 100.2)  # taken by other requests while it was queued
    assert set(history.revised) == {"waited"}
    revised = history.revised["waited"]
    assert revised.cause == Cause.EVICTED and revised.losses[0].removed_at == at(100.2)


def test_a_kept_history_forgets_by_generations_what_was_not_seen_again() -> None:
    history = FleetHistory()
    first = prompt(seed=1)
    hashes = chain(first)
    stored(history, 1, hashes, 10)
    removed(history, 1, hashes, 20)
    history.turn()  # one generation later it is still known, evicted
    found = history.diagnose(request(prompt(seed=2), seconds=30))
    assert isinstance(found, Diagnosis) and found.cause == Cause.EVICTED
    history.turn()  # two: the first request's own tail, not seen again, is forgotten
    again = history.diagnose(request(first, seconds=40))
    assert isinstance(again, Diagnosis)
    tail = [loss for loss in again.losses if loss.first_token >= len(SYSTEM)]
    # Never seen again, as a prompt's own tail past where the template's prompts part: new content.
    assert tail[0].cause == Cause.NEW_CONTENT and again.diverged_at is None
    assert history.generation_blocks == len(hashes)  # this generation: the chain just diagnosed


def test_on_a_hybrid_server_the_tail_below_its_effective_block_is_below_block_not_a_miss() -> None:
    # 200 tokens, all resident and none reused: on a plain server the engine lost 192 tokens it had
    # (unexplained); where a hit is a multiple of 256 tokens, none of it could ever hit.
    history = FleetHistory()
    tokens = prompt(tail=40)
    stored(history, 1, chain(tokens), 10)
    plain = diagnosed(history, request(tokens))
    assert plain.cause == Cause.UNEXPLAINED
    hybrid = diagnosed(history, replace(request(tokens), effective_block=256))
    assert hybrid.cause == Cause.BELOW_BLOCK
    assert hybrid.losses == (Loss(Cause.BELOW_BLOCK, 0, 200),)


def test_with_eagle_the_dropped_last_block_is_below_block() -> None:
    history = FleetHistory()
    tokens = prompt(tail=32)  # 192 tokens: 11 blocks reusable, 10 with the last one dropped
    stored(history, 1, chain(tokens), 10)
    found = diagnosed(history, replace(request(tokens, cached=160), drops_last_block=True))
    assert found.cause is None
    assert found.losses == (Loss(Cause.BELOW_BLOCK, 160, 32),)


# -- tiers and KV-cache groups -------------------------------------------------------------------


def tier_event(history: FleetHistory, kind: EventKind, hashes: list[int], seconds: float, *,
               medium: str = "GPU", group: int | None = 0, reason: int | None = None) -> None:  # fmt: skip
    history.apply_blocks(1, 0, 0, at(seconds), kind, hashes, medium=medium, group=group, reason=reason)


def test_blocks_removed_from_gpu_that_the_cpu_tier_still_holds_are_demoted_not_evicted() -> None:
    history = FleetHistory()
    tokens = prompt()
    hashes = chain(tokens)
    tier_event(history, EventKind.STORED, hashes, 10)
    tier_event(history, EventKind.STORED, hashes[4:8], 11, medium="CPU")  # the offloading connector's copy
    tier_event(history, EventKind.REMOVED, hashes[4:], 50)
    found = diagnosed(history, request(tokens, cached=4 * SIZE))
    assert found.losses[0] == Loss(Cause.DEMOTED, 64, 4 * SIZE, server=1, stored_at=at(10), removed_at=at(50))
    assert found.losses[1] == Loss(
        Cause.EVICTED, 128, 4 * SIZE, server=1, stored_at=at(10), removed_at=at(50)
    )
    assert found.cause == Cause.DEMOTED  # the earlier of equal losses


def test_a_block_the_lower_tier_dropped_too_is_evicted() -> None:
    history = FleetHistory()
    hashes = chain(tokens := prompt())
    tier_event(history, EventKind.STORED, hashes, 10)
    tier_event(history, EventKind.STORED, hashes, 11, medium="CPU")
    tier_event(history, EventKind.REMOVED, hashes, 50)
    tier_event(history, EventKind.REMOVED, hashes, 60, medium="CPU")
    assert diagnosed(history, request(tokens)).cause == Cause.EVICTED


def test_a_cpu_copy_is_never_taken_for_gpu_residency() -> None:
    history = FleetHistory()
    hashes = chain(tokens := prompt())
    tier_event(history, EventKind.STORED, hashes, 11, medium="CPU")  # only the CPU tier holds them
    found = diagnosed(history, request(tokens))
    assert found.funnel.resident_here == 0 and found.cause == Cause.DEMOTED
    tier_event(history, EventKind.CLEARED, [], 20, medium="CPU")  # the CPU tier reset; GPU untouched
    assert diagnosed(history, request(tokens, seconds=30)).cause != Cause.DEMOTED


def test_blocks_reloaded_from_the_cpu_tier_count_as_reused() -> None:
    history = FleetHistory()
    hashes = chain(tokens := prompt())
    tier_event(history, EventKind.STORED, hashes, 10)
    tier_event(history, EventKind.STORED, hashes, 11, medium="CPU")
    tier_event(history, EventKind.REMOVED, hashes, 50)
    found = diagnosed(history, request(tokens, cached=12 * SIZE))  # vLLM's cached tokens include loads
    assert found.cause is None and not found.unexpected_hit


def test_another_kv_cache_groups_events_never_move_the_attention_groups_residency() -> None:
    """Hybrid models send one event per group with the same hashes: a sliding-window group's
    removal is not the attention blocks' (AIBrix #2285's false matches, the other way round)."""
    history = FleetHistory()
    hashes = chain(tokens := prompt())
    tier_event(history, EventKind.STORED, hashes, 10, group=0)
    tier_event(history, EventKind.STORED, hashes, 10, group=1)
    tier_event(history, EventKind.REMOVED, hashes, 50, group=1)  # the window moved on
    tier_event(history, EventKind.STORED, chain(prompt(seed=9, changed_at=0)), 60, group=1)
    found = diagnosed(history, request(tokens, cached=0))
    assert found.funnel.resident_here == 12 * SIZE and found.cause == Cause.UNEXPLAINED
    other = prompt(seed=9, changed_at=0)
    assert diagnosed(history, request(other, seconds=101)).funnel.resident_here == 0  # group 1's only


def test_a_removal_that_says_demoted_is_demoted_though_no_lower_tier_said_it_stored_them() -> None:
    """SGLang's hierarchical cache names the reason (#39620) where no host-tier BlockStored is seen."""
    history = FleetHistory()
    hashes = chain(tokens := prompt())
    tier_event(history, EventKind.STORED, hashes, 10)
    tier_event(history, EventKind.REMOVED, hashes, 50, reason=RemovalReason.DEMOTED)
    found = diagnosed(history, request(tokens))
    assert found.losses[0] == Loss(Cause.DEMOTED, 0, 12 * SIZE, server=1, stored_at=at(10), removed_at=at(50))
    tier_event(history, EventKind.REMOVED, hashes, 60, medium="CPU_TIER1", reason=RemovalReason.EVICTED)
    assert (
        diagnosed(history, request(tokens, seconds=110)).cause == Cause.EVICTED
    )  # the host dropped them too


@pytest.mark.parametrize("reason", [RemovalReason.RELEASED, RemovalReason.ABORTED])
def test_a_requests_own_blocks_freed_as_it_ended_take_no_cached_block_away(reason: RemovalReason) -> None:
    """SGLang frees a finished (or aborted) request's KV beyond what its radix tree keeps: blocks of
    the same hashes stay cached, so the next request reusing them is no surprise and no loss."""
    history = FleetHistory()
    hashes = chain(tokens := prompt())
    tier_event(history, EventKind.STORED, hashes, 10)
    tier_event(history, EventKind.REMOVED, hashes, 50, reason=reason)
    found = diagnosed(history, request(tokens, cached=12 * SIZE))
    assert found.cause is None and found.funnel.resident_here == 12 * SIZE and not found.unexpected_hit


@pytest.mark.parametrize(
    "reason", [None, RemovalReason.EVICTED, RemovalReason.CLEARED, RemovalReason.UNKNOWN]
)
def test_a_removal_for_capacity_a_clear_or_a_reason_not_known_is_an_eviction(reason: int | None) -> None:
    history = FleetHistory()
    hashes = chain(tokens := prompt())
    tier_event(history, EventKind.STORED, hashes, 10)
    tier_event(history, EventKind.REMOVED, hashes, 50, reason=reason)
    found = diagnosed(history, request(tokens))
    assert found.losses[0] == Loss(Cause.EVICTED, 0, 12 * SIZE, server=1, stored_at=at(10), removed_at=at(50))


def teach_fan_out(history: FleetHistory, stable: list[int]) -> None:
    """Requests of another tenant (salt) that repeat `stable` whole and go on with their own: the
    template's prompts part after it, so departures before it are changes, not new content."""
    for seed in range(20, 30):
        own = [random.Random(seed).randrange(50_000) for _ in range(40)]
        history.diagnose(request([*stable, *own], seconds=1 + seed / 100, salt="teacher"))


def test_a_changed_prompt_names_the_part_that_changed_from_the_request_it_departs_from() -> None:
    history = FleetHistory()
    parts = Parts(model="tiny", tools=("t1", "t2"), messages=("u1",), latest=1)
    older, newer = prompt(seed=1), [*prompt(seed=1)[:162], *prompt(seed=2)[162:]]
    teach_fan_out(history, older)
    for n, (earlier, its) in enumerate(((older, parts), (newer, replace(parts, system="s2")))):
        history.diagnose(replace(request(earlier, seconds=10 + n), key=f"r{n}", parts=its))
        stored(history, 1, chain(earlier), 10.5 + n)
    later = [*older[:180], *prompt(seed=3)[180:]]  # shares block 10 with the older one, not the newer
    reordered = replace(parts, tools=("t2", "t1"), messages=("u9",))
    found = diagnosed(history, replace(request(later, cached=11 * SIZE), key="r2", parts=reordered))
    assert found.diverged_at == 180 and found.compared_with == "r0"
    assert (found.changed_part, found.part_detail) == (RequestPart.TOOLS, "reordered")
    without = diagnosed(history, request(prompt(seed=4, changed_at=37), cached=2 * SIZE))
    assert without.cause == Cause.PROMPT_CHANGED and without.changed_part is None  # no digests: no part


def test_an_adapter_swap_departs_at_the_first_token_whatever_tokens_it_shares() -> None:
    history = FleetHistory()
    parts = Parts(model="tiny", messages=("u1",), latest=1)
    tokens = prompt(seed=1)
    history.diagnose(replace(request(tokens, seconds=10), key="base", parts=parts))
    swapped = replace(request(tokens), block_hashes=signed_block_hashes(tokens, SIZE, lora=LoraKey("a", "p")),
                      key="lora", parts=replace(parts, model="a", adapter=True))  # fmt: skip
    found = diagnosed(history, swapped)
    assert found.cause == Cause.PROMPT_CHANGED and found.changed_part == RequestPart.ADAPTER
    assert found.diverged_at == 0 and found.compared_with == "base"


@pytest.mark.parametrize("seed", range(3))
def test_a_new_tail_judged_at_once_is_judged_as_block_by_block(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_all_unknown` (an unseen tail's blocks given the cause of its first at once) against the
    check of each block, over salts, servers, evictions and changed prompts, and tails whose later
    blocks were seen alone (a record or event of them without the blocks before them)."""
    mix = random.Random(seed)
    histories = {"at once": FleetHistory(), "block by block": FleetHistory()}
    found: dict[str, list[Diagnosis | Unknown]] = {name: [] for name in histories}
    for n in range(150):
        changed = mix.choice([None, 20, 90])
        tail = mix.choice([n + 100, mix.randrange(6)])  # a new tail, or one of a few
        tokens = prompt(tail=mix.randrange(0, 120), seed=tail, changed_at=changed)
        salt = mix.choice([None, None, "acme", "other"])
        asked = request(tokens, server=mix.randrange(2), seconds=n, salt=salt, family=mix.choice(["a", "b"]),
                        cached=mix.choice([0, 16, 160]))  # fmt: skip
        kept = list(asked.block_hashes[: mix.randrange(0, 12)])
        # Some later blocks of its chain seen before it, under another salt, without its first ones.
        alone = slice(mix.randrange(11, 14), mix.randrange(14, 18))
        ahead = request(tokens, seconds=n, salt=mix.choice([None, "acme", "other"]), family="ahead")
        ahead = replace(ahead, block_hashes=ahead.block_hashes[alone],
                        neutral_hashes=ahead.neutral_hashes[alone],
                        prompt_tokens=SIZE * len(ahead.block_hashes[alone]))  # fmt: skip
        for name, history in histories.items():
            with monkeypatch.context() as patched:
                if name == "block by block":
                    patched.setattr(FleetHistory, "_all_unknown", lambda *_: False)
                if n % 3 == 0:
                    history.diagnose(ahead)
                elif n % 3 == 1:  # stored and evicted by its server: seen under no salt the history knows
                    stored(history, asked.server, list(asked.block_hashes[alone]), n - 0.6)
                    removed(history, asked.server, list(asked.block_hashes[alone]), n - 0.5)
                found[name].append(history.diagnose(asked))
                stored(history, asked.server, kept, n)
                if n % 7 == 0:
                    removed(history, asked.server, list(asked.block_hashes[2:5]), n + 0.5)
    assert found["at once"] == found["block by block"]
    assert {d.cause for d in found["at once"] if isinstance(d, Diagnosis)} >= {Cause.COLD, Cause.SALT}
