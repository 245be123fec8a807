"""Where a prompt departs from the earlier prompts of its template and salt: the longest common prefix
over all of them, as a brute force finds it, from the blocks they shared and the tokens that followed."""

import random

import numpy as np
import pytest

from app.domain import followers
from app.domain.blockhash import signed_block_hashes
from app.domain.followers import Followers


def common_prefix(a: list[int], b: list[int]) -> int:
    length = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:length]) != np.asarray(b[:length]))
    return int(differ[0]) if differ.size else length


def brute_force(prompt: list[int], earlier: list[list[int]]) -> int:
    """The longest prefix the prompt shares with any earlier prompt."""
    return max((common_prefix(prompt, other) for other in earlier), default=0)


def test_the_older_prompt_sharing_more_of_the_next_block_is_the_one_departed_from() -> None:
    rng = random.Random(3)
    shared = [rng.randrange(50_000) for _ in range(64)]  # two blocks of 32
    older = shared + [rng.randrange(50_000) for _ in range(60)]
    newer = shared + older[64:66] + [rng.randrange(50_000) for _ in range(58)]  # 2 tokens of block 2
    prompt = shared + older[64:93] + [rng.randrange(50_000) for _ in range(40)]  # 29 of block 2
    memory = Followers()
    for earlier in (older, newer):  # the newer one last: the one a single follower per block kept
        memory.remember(signed_block_hashes(earlier, 32), earlier, 32)
    assert (
        memory.divergence(signed_block_hashes(prompt, 32), prompt, 32)
        == 93
        == brute_force(prompt, [older, newer])
    )
    assert memory.divergence(signed_block_hashes(prompt, 32), None, 32) == 64  # hash-only: to the block


@pytest.mark.parametrize("seed", range(4))
def test_the_divergence_is_the_longest_common_prefix_over_all_earlier_prompts(seed: int) -> None:
    """Prompts of a three-token alphabet in blocks of 4: every block a fan-out point of many followers,
    prompts that end inside another's block, or repeat one whole."""
    rng = random.Random(seed)
    memory, earlier = Followers(), list[list[int]]()
    for _ in range(400):
        if earlier and rng.random() < 0.5:  # a copy of an earlier one up to a point, then its own
            base = rng.choice(earlier)
            prompt = base[: rng.randrange(len(base) + 1)] + [
                rng.randrange(3) for _ in range(rng.randrange(12))
            ]
        else:
            prompt = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]
        chain = signed_block_hashes(prompt, 4)
        assert memory.divergence(chain, prompt, 4) == brute_force(prompt, earlier)
        memory.remember(chain, prompt, 4)
        earlier.append(prompt)


def test_a_fan_out_point_keeps_a_bounded_number_of_followers_the_closest_ones_merged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(followers, "FOLLOWERS_PER_BLOCK", 8)
    memory = Followers()
    for n in range(40):
        prompt = [1, 2, 3, 4, n, n, n, n, 9]  # block 1 differs in every prompt
        memory.remember(signed_block_hashes(prompt, 4), prompt, 4)
    assert len(memory) == 1 + 8 + 40  # block 0 after the start, 8 after it, each prompt's own tail
    later = [1, 2, 3, 4, 39, 39, 7, 7]
    assert memory.divergence(signed_block_hashes(later, 4), later, 4) == 6  # the newest is kept


def test_the_memory_forgets_the_blocks_not_seen_for_the_longest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(followers, "FAMILY_MEMORY_BLOCKS", 50)
    memory = Followers()
    rng = random.Random(5)
    for _ in range(30):
        prompt = [rng.randrange(1000) for _ in range(20)]
        memory.remember(signed_block_hashes(prompt, 4), prompt, 4)
        assert len(memory) <= 50


@pytest.mark.parametrize("seed", range(3))
def test_a_new_tail_added_at_once_leaves_the_memory_as_block_by_block(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_add_new` (a prompt's unknown tail in one update) against `_add` of each of its blocks: the
    same blocks, tokens and order, through forgetting, fan-out points, repeats and known blocks."""
    monkeypatch.setattr(followers, "FAMILY_MEMORY_BLOCKS", 120)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(4, 40))] for _ in range(3)]
    prompts = []
    for _ in range(80):
        tokens = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(0, 30))]
        if rng.random() < 0.2:
            tokens += tokens[:8] * 2  # a tail repeating tokens: its chain's hashes differ all the same
        prompts.append((signed_block_hashes(tokens, 4), tokens))
    prompts.append(([11, 12, 13, 11, 12], [1] * 20))  # a chain repeating keys (a collision's stand-in)
    prompts.append(([21, 22, 12, 23], [2] * 16))  # a tail with a block the memory holds
    batched, stepped = Followers(), Followers()
    for chain_keys, tokens in prompts:
        batched.remember(chain_keys, tokens, 4)
        with monkeypatch.context() as patched:
            patched.setattr(Followers, "_add_new", lambda *_: False)
            stepped.remember(chain_keys, tokens, 4)
        assert list(batched._blocks.items()) == list(stepped._blocks.items())
        assert len(batched) == len(stepped)


def test_a_prompt_of_unknown_block_size_is_remembered_without_blocks() -> None:
    """A record without a block size is remembered with size 0 and no chain (misscauses
    `remember`): nothing to add, and no error (the new tail's shortcut once divided by it)."""
    followers = Followers()
    followers.remember([], [1, 2, 3], 0)
    assert len(followers) <= 1
