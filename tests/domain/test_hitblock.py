"""The effective block: how a hybrid model's KV-cache groups and EAGLE/MTP round a prefix-cache hit."""

import pytest

from app.domain.hitblock import HitBlock, effective_block


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
