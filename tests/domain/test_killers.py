"""Cache killers are found, placed and classified on the simulator's own rendered traffic."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest

from app.domain.blockhash import signed_to_wire
from app.domain.blocks import cached_tokens_for_full_match
from app.domain.gpt2 import decode, encode
from app.domain.killers import (
    Killer,
    KillerClass,
    KillerSettings,
    Prompt,
    Straddle,
    find_killers,
    sample_texts,
)
from simulator.template_faults import Fault
from tests.support.rendered_prompts import (
    BLOCK_SIZE,
    RenderedPrompt,
    demo_template,
    interleave,
    planned_traffic,
    token_at,
    variant_traffic,
)

ALL_TEMPLATES = {"support": 3.0, "billing": 2.0, "agent": 1.0}  # the demo's mix


def _killers(
    traffic: Sequence[RenderedPrompt], *, hash_only: bool = False, settings: KillerSettings | None = None
) -> tuple[Killer, ...]:
    prompts = [p.prompt(hash_only=hash_only) for p in traffic]
    return find_killers(prompts, BLOCK_SIZE, decode=decode, settings=settings)


@dataclass(frozen=True, slots=True)
class FaultCase:
    template: str
    fault: Fault
    at: float  # virtual second of the fault's commit: requests before it render the old version
    klass: KillerClass
    where: Callable[[str], int]  # the character where the varying text starts, in a faulted prompt


FAULTS = [
    # The time and request id move to the top: the killer is the moved line's first token.
    FaultCase("support", "volatile_top", 60, KillerClass.TIMESTAMP, lambda text: text.index("Current time:")),
    # Tools in the order they are passed: the first tool's name varies.
    FaultCase(
        "agent", "unsorted_tools", 0, KillerClass.REORDERED_ITEMS, lambda text: text.index("Tools:\n- ") + 8
    ),
    # Retrieved passages first, in the order they are passed: "- Manual <section>" varies at the section.
    FaultCase("support", "shuffled_chunks", 0, KillerClass.REORDERED_ITEMS, lambda text: len("- Manual")),
    # The schema in its own key order: the first key varies.
    FaultCase(
        "billing", "random_json_keys", 0, KillerClass.JSON_KEY_ORDER, lambda text: text.index('\n{"') + 3
    ),
]


@cache
def _faulted(case: FaultCase, mixed: bool) -> tuple[RenderedPrompt, ...]:
    """About 300 prompts of the faulted template, alone or among the other demo templates' prompts."""
    mix = ALL_TEMPLATES if mixed else {case.template: 1.0}
    count = round(300 * sum(mix.values()) / mix[case.template])
    return tuple(planned_traffic(count, mix=mix, faults={case.template: (case.at, case.fault)}))


def _expected_position(case: FaultCase, traffic: Sequence[RenderedPrompt]) -> int:
    faulted = next(p for p in traffic if p.template == case.template and _is_faulted(case, p.text))
    return token_at(faulted.text, case.where(faulted.text))


def _is_faulted(case: FaultCase, text: str) -> bool:
    return not (case.fault == "volatile_top" and not text.startswith("Current time:"))


@pytest.mark.parametrize("mixed", [False, True], ids=["alone", "mixed"])
@pytest.mark.parametrize("case", FAULTS, ids=[c.fault for c in FAULTS])
def test_a_faulted_template_has_its_killer_first_at_the_varying_token(case: FaultCase, mixed: bool) -> None:
    traffic = _faulted(case, mixed)
    position = _expected_position(case, traffic)
    top = _killers(traffic)[0]
    assert (top.klass, top.position_token, top.position_block) == (
        case.klass,
        position,
        position // BLOCK_SIZE,
    )
    assert top.suggestion and top.samples and top.tokens_lost > 0


@pytest.mark.parametrize("mixed", [False, True], ids=["alone", "mixed"])
@pytest.mark.parametrize("case", FAULTS, ids=[c.fault for c in FAULTS])
def test_hash_only_mode_finds_the_same_killer_to_the_block(case: FaultCase, mixed: bool) -> None:
    traffic = _faulted(case, mixed)
    top = _killers(traffic, hash_only=True)[0]
    assert top.position_block == _expected_position(case, traffic) // BLOCK_SIZE
    assert (top.position_token, top.klass, top.samples, top.straddle) == (
        None,
        KillerClass.UNCLASSIFIED,
        (),
        None,
    )


def test_the_moved_timestamp_costs_the_cacheable_tokens_of_every_request_after_the_fault() -> None:
    case = FAULTS[0]
    traffic = _faulted(case, mixed=False)
    faulted = [p for p in traffic if _is_faulted(case, p.text)]
    cacheable = sum(cached_tokens_for_full_match(len(p.token_ids), BLOCK_SIZE) for p in faulted)
    (killer,) = _killers(traffic)
    assert killer.requests_affected == len(faulted)
    assert 0.9 * cacheable <= killer.tokens_lost <= cacheable
    assert killer.straddle is None  # the line starts the prompt


@pytest.mark.parametrize("hash_only", [False, True], ids=["tokens", "hash-only"])
def test_a_stable_template_has_no_killer_though_its_tail_varies_in_every_request(hash_only: bool) -> None:
    traffic = planned_traffic(300, mix={"support": 1.0})
    assert len({p.text for p in traffic}) == len(traffic)  # the time and request id near the end
    assert _killers(traffic, hash_only=hash_only) == ()


@pytest.mark.parametrize("hash_only", [False, True], ids=["tokens", "hash-only"])
def test_mixed_demo_traffic_without_faults_has_no_killer(hash_only: bool) -> None:
    # Three templates interleaved differ from token 0, and each one's question varies at its end:
    # neither is a killer (nothing cacheable follows the question; templates never re-converge).
    traffic = planned_traffic(900, mix=ALL_TEMPLATES)
    assert _killers(traffic, hash_only=hash_only) == ()


@pytest.mark.parametrize("hash_only", [False, True], ids=["tokens", "hash-only"])
def test_a_killer_in_each_of_two_mixed_templates_ranks_by_cost(hash_only: bool) -> None:
    faults: dict[str, tuple[float, Fault]] = {
        "support": (60, "volatile_top"),
        "billing": (0, "random_json_keys"),
    }
    traffic = planned_traffic(900, mix=ALL_TEMPLATES, faults=faults)
    killers = _killers(traffic, hash_only=hash_only)
    assert [k.position_block for k in killers] == [0, 10]
    assert killers[0].tokens_lost > killers[1].tokens_lost


SUPPORT = demo_template("support").text
FIRST_LINE, REST = SUPPORT.split("\n", 1)


def _tenant(index: int) -> str:
    """40 tenants, drawn at random: each sends several requests."""
    return f"tenant-{random.Random(index).randrange(40):02d}"


@cache
def _per_user_traffic() -> tuple[RenderedPrompt, ...]:
    # The edit: a line naming the tenant's account, inside the shared part.
    text = FIRST_LINE + "\nThis conversation is with the customer account {{ tenant }}.\n" + REST
    return tuple(variant_traffic("support", 300, text_for=lambda index, rng: text, tenant_for=_tenant))


@pytest.mark.parametrize("hash_only", [False, True], ids=["tokens", "hash-only"])
def test_a_tenant_line_in_the_shared_part_is_per_user_data(hash_only: bool) -> None:
    traffic = _per_user_traffic()
    text = traffic[0].text
    position = token_at(text, text.index("account tenant-") + len("account tenant-"))
    (killer,) = _killers(traffic, hash_only=hash_only)
    assert killer.klass == KillerClass.PER_USER
    assert killer.position_block == position // BLOCK_SIZE
    assert killer.position_token == (None if hash_only else position)
    # Only each tenant's first request loses: its later ones find their own prefix cached.
    assert killer.requests_affected <= len({p.tenant for p in traffic})


def test_per_user_data_holds_among_the_other_templates() -> None:
    others = planned_traffic(300, mix={"billing": 2.0, "agent": 1.0})
    (killer,) = _killers(interleave(_per_user_traffic(), others))
    assert (killer.klass, killer.requests_through) == (KillerClass.PER_USER, 300)


def test_trailing_whitespace_that_drifts_per_request_is_whitespace_drift() -> None:
    lines = SUPPORT.split("\n")

    def text_for(index: int, rng: random.Random) -> str:
        # The edit: five policy lines, each with or without trailing spaces (32 ways).
        edited = [line + "  " if 2 <= i <= 6 and rng.random() < 0.5 else line for i, line in enumerate(lines)]
        return "\n".join(edited)

    traffic = variant_traffic("support", 300, text_for=text_for)
    text = next(p.text for p in traffic if "queues.\n" in p.text)
    (killer,) = _killers(traffic)
    assert killer.klass == KillerClass.WHITESPACE_DRIFT
    assert killer.position_token == token_at(text, text.index("queues.") + len("queues."))


EXAMPLES = [
    (
        "How do I change the Wi-Fi password?",
        "1. Open the router page (Manual 3.4). 2. Choose Wi-Fi, then Password.",
    ),
    ("Why is the power light amber?", "1. The router is starting (Manual 5.1). 2. Wait two minutes."),
    (
        "Can I turn off the 5 GHz network?",
        "1. Open Wi-Fi settings (Manual 3.4). 2. Switch off the -5G network.",
    ),
    (
        "How long does a firmware update take?",
        "1. About four minutes (Manual 4.2). 2. Do not power off the router.",
    ),
    ("What does a red internet light mean?", "1. The line is down (Manual 5.1). 2. Check the cable first."),
    (
        "How do I restore factory settings?",
        "1. Hold reset for ten seconds (Manual 2.1). 2. Wait for the amber light.",
    ),
]


def test_examples_drawn_from_a_small_pool_are_rotating_examples() -> None:
    def text_for(index: int, rng: random.Random) -> str:
        # The edit: two examples from a pool of six above the tools, a new pick per request.
        shown = "".join(f"Q: {q}\nA: {a}\n" for q, a in rng.sample(EXAMPLES, 2))
        return SUPPORT.replace(
            "Tools you can call:", f"Examples of good answers:\n{shown}\nTools you can call:"
        )

    traffic = variant_traffic("support", 300, text_for=text_for)
    text = traffic[0].text
    (killer,) = _killers(traffic)
    assert killer.klass == KillerClass.ROTATING_EXAMPLES
    marker = "Examples of good answers:\nQ:"
    assert killer.position_token == token_at(text, text.index(marker) + len(marker))
    assert all(sample.startswith("Q: ") for sample in killer.samples)


# Three-digit numbers that are one GPT-2 token each (with their leading space).
ONE_TOKEN_NUMBERS = [n for n in range(100, 1000) if len(encode(f" {n}")) == 1]


def _head_ending(shared_in_block: int) -> str:
    """The support prompt's first line and a line that ends ``shared_in_block`` tokens into a block."""
    for pad in range(BLOCK_SIZE):
        head = FIRST_LINE + "\nKeep this number in mind" + " please" * pad + ".\nConversation number:"
        if len(encode(head)) % BLOCK_SIZE == shared_in_block:
            return head
    raise AssertionError("no padding fits")


def test_a_varying_token_two_tokens_before_a_block_boundary_is_a_straddle() -> None:
    head = _head_ending(BLOCK_SIZE - 2)
    traffic = variant_traffic(
        "support", 300, text_for=lambda index, rng: f"{head} {ONE_TOKEN_NUMBERS[index % 300]}\n{REST}"
    )
    position = len(encode(head))
    (killer,) = _killers(traffic)
    assert (killer.klass, killer.position_token) == (KillerClass.NUMBER, position)
    assert killer.straddle == Straddle(block_index=position // BLOCK_SIZE, shared_tokens=14, block_size=16)


def test_samples_are_few_short_distinct_and_show_the_varying_text() -> None:
    traffic = _faulted(FAULTS[0], mixed=False)
    (full,) = _killers(traffic)
    (short,) = _killers(traffic, settings=KillerSettings(max_samples=3, sample_chars=20))
    assert len(full.samples) == 5 == len(set(full.samples))
    assert all(sample.startswith("Current time: 2026-01-01T") for sample in full.samples)
    assert len(short.samples) == 3 == len(set(short.samples))
    # Cut around where the samples differ (the seconds), and marked as cut.
    assert all(
        sample.startswith("…") and len(sample) <= 21 and "+00:00" in sample for sample in short.samples
    )


@pytest.mark.parametrize("mixed", [False, True], ids=["alone", "mixed"])
def test_the_sample_requests_decode_again_into_the_same_samples(mixed: bool) -> None:
    traffic = _faulted(FAULTS[0], mixed)
    killer = _killers(traffic)[0]
    assert len(killer.sample_requests) == len(killer.samples)
    assert all(traffic[i].template == "support" for i in killer.sample_requests)
    assert killer.position_token is not None
    ids = [traffic[i].token_ids for i in killer.sample_requests]
    assert sample_texts(ids, killer.position_token, decode) == killer.samples
    assert sample_texts(ids[:1], killer.position_token, decode) == killer.samples[:1]  # alone, too
    assert sample_texts([], killer.position_token, decode) == ()


def test_without_text_the_sample_requests_are_a_few_affected_ones() -> None:
    traffic = _faulted(FAULTS[0], mixed=False)
    (killer,) = _killers(traffic, hash_only=True)
    assert killer.samples == () and 0 < len(killer.sample_requests) <= KillerSettings().max_samples
    # Hash-only mode counts the very first request too: nothing earlier shows its blocks could be shared.
    later = [i for i in killer.sample_requests if i > 0]
    assert later and all(traffic[i].text.startswith("Current time:") for i in later)


def test_without_a_decoder_the_position_is_exact_and_the_class_unknown() -> None:
    case = FAULTS[3]
    traffic = _faulted(case, mixed=False)
    (killer,) = find_killers([p.prompt() for p in traffic], BLOCK_SIZE)
    assert killer.position_token == _expected_position(case, traffic)
    assert (killer.klass, killer.samples) == (KillerClass.UNCLASSIFIED, ())
    assert killer.straddle == Straddle(block_index=10, shared_tokens=15, block_size=16)  # '{"' ends block 10


def test_token_ids_and_hashes_as_numpy_arrays_give_the_same_killers() -> None:
    traffic = _faulted(FAULTS[2], mixed=True)
    lists = [p.prompt() for p in traffic]
    arrays = [Prompt(np.array(p.block_hashes), np.array(p.token_ids), p.tenant) for p in traffic]
    assert find_killers(arrays, BLOCK_SIZE, decode=decode) == find_killers(lists, BLOCK_SIZE, decode=decode)


def test_wire_hashes_give_the_same_killers_as_stored_signed_ones() -> None:
    traffic = _faulted(FAULTS[1], mixed=False)
    signed = [p.prompt(hash_only=True) for p in traffic]
    wire = [Prompt(block_hashes=[signed_to_wire(h) for h in p.block_hashes], tenant=p.tenant) for p in signed]
    assert find_killers(wire, BLOCK_SIZE) == find_killers(signed, BLOCK_SIZE)


def test_no_prompts_or_prompts_shorter_than_a_block_have_no_killer() -> None:
    short = [Prompt(block_hashes=[], token_ids=[i, i + 1], tenant="acme") for i in range(50)]
    assert find_killers([], BLOCK_SIZE) == ()
    assert find_killers(short, BLOCK_SIZE, decode=decode) == ()


def test_a_block_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="block_size"):
        find_killers([], 0)
