"""The effective block: how a hybrid model's KV-cache groups and EAGLE/MTP round a prefix-cache hit."""

import pytest

from app.domain.hitblock import HitBlock, effective_block
from app.domain.lossruns import BlockCause, within_hit_units
from app.domain.misses import Cause


@pytest.mark.parametrize(
    ("block_size", "stated", "groups", "effective"),
    [
        (16, None, (), 16),  # a plain server
        (16, None, (16,), 16),  # one full-attention group
        (16, None, (16, 3584), 3584),  # attention + Mamba: the LCM
        (32, None, (48,), 96),  # groups whose sizes do not divide each other
        (16, 3584, (16,), 3584),  # what /metrics states and what the events say, together
        (3584, 16, (), 3584),  # a finer stated alignment cannot be finer than the chains
        (16, 0, (0, -1), 16),  # unusable sizes are left out
    ],
)
def test_the_effective_block_is_the_lcm_of_the_groups_and_what_vllm_states(
    block_size: int, stated: int | None, groups: tuple[int, ...], effective: int
) -> None:
    assert effective_block(block_size, stated=stated, groups=groups) == effective


@pytest.mark.parametrize(
    ("hit", "prompt", "blocks"),
    [
        (HitBlock(16, 16), 200, 12),  # plain: never the last token
        (HitBlock(16, 16), 17, 1),
        (HitBlock(16, 16, drops_last=True), 200, 11),  # EAGLE drops the last matched block
        (HitBlock(16, 3584), 2015, 0),  # the public report: a 2,015-token prompt never hits
        (HitBlock(16, 3584), 8015, 448),  # ... an 8,015-token one hits 7,168 tokens
        (HitBlock(16, 3584), 3585, 224),
        (HitBlock(16, 3584, drops_last=True), 3585, 0),  # hybrid + MTP: one block short of a hit
        (HitBlock(3584, 3584, drops_last=True), 7169, 1),
    ],
)
def test_reusable_blocks_are_whole_effective_blocks_after_the_dropped_one(
    hit: HitBlock, prompt: int, blocks: int
) -> None:
    assert hit.reusable_blocks(prompt) == blocks


def test_the_smallest_prompt_that_can_hit() -> None:
    for hit in (HitBlock(16, 16), HitBlock(16, 512), HitBlock(16, 512, drops_last=True)):
        smallest = hit.smallest_hit_prompt()
        assert hit.reusable_blocks(smallest) > 0 and hit.reusable_blocks(smallest - 1) == 0
    assert HitBlock(16, 16).plain and not HitBlock(16, 32).plain and not HitBlock(16, 16, True).plain


def test_resident_blocks_of_an_effective_block_with_a_gone_one_take_its_cause() -> None:
    """Units of 4 blocks from block 0; the lost range starts at block 2 (mid-unit): in each unit the
    resident blocks before the first missing one take its cause, a unit wholly resident keeps them."""
    here, gone, changed = (
        BlockCause(Cause.UNEXPLAINED, here=True),
        BlockCause(Cause.EVICTED, server=1),
        BlockCause(Cause.PROMPT_CHANGED),
    )
    causes = [here, gone, here, here, here, changed, here, here, here, here]  # blocks 2..11
    found = within_hit_units(causes, first_block=2, per_hit=4)
    assert [c.cause for c in found] == [
        Cause.EVICTED, Cause.EVICTED,  # unit 0: blocks 2, 3
        Cause.PROMPT_CHANGED, Cause.PROMPT_CHANGED, Cause.PROMPT_CHANGED, Cause.PROMPT_CHANGED,  # unit 1
        Cause.UNEXPLAINED, Cause.UNEXPLAINED, Cause.UNEXPLAINED, Cause.UNEXPLAINED,  # unit 2: all resident
    ]  # fmt: skip
    assert found[4].here is False and found[0] is gone  # the unit's missing block's cause, as found
    assert within_hit_units(causes, first_block=2, per_hit=1) == causes  # plain servers: unchanged
