"""The granularity at which a server's prefix cache can hit: its effective block.

vLLM hashes a prompt in blocks of the server's block size, but on a model with several KV-cache
groups (hybrid attention + Mamba, sliding window) a hit must be a whole number of blocks of every
group: its length is a multiple of the LCM of the groups' block sizes (vLLM's
HybridKVCacheCoordinator, `lcm_block_size`; newer builds state it as `cache_hit_alignment_tokens`
in `vllm:cache_config_info`). With speculative decoding by EAGLE or MTP, the full-attention group
drops the last block it matched (its hidden state must be computed again for the drafter) before
the hit is aligned down (`FullAttentionManager.find_longest_cache_hit`, `use_eagle`). So on a
hybrid model whose groups hit at 3,584 tokens, a 2,015-token prompt never hits, and with EAGLE on
a 7,000-token one does not either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import lcm


@dataclass(frozen=True, slots=True)
class HitBlock:
    """How a server's prefix cache rounds a hit: chains are hashed in `block_size` blocks, a hit is
    a multiple of `effective` (a multiple of `block_size`), after one block is dropped when
    `drops_last` (speculative decoding by EAGLE/MTP)."""

    block_size: int
    effective: int
    drops_last: bool = False

    @property
    def plain(self) -> bool:
        """Whether it hits as a plain one-group server without speculative decoding does."""
        return self.effective == self.block_size and not self.drops_last

    def reusable_blocks(self, prompt_tokens: int) -> int:
        """Blocks (of `block_size`) vLLM may reuse of a prompt whose every block is resident: never
        its last token, one block fewer when it drops the last, then whole effective blocks."""
        blocks = max(prompt_tokens - 1, 0) // self.block_size
        if self.drops_last and blocks:
            blocks -= 1
        per_hit = self.effective // self.block_size
        return blocks // per_hit * per_hit

    def smallest_hit_prompt(self) -> int:
        """The fewest prompt tokens that can hit at all."""
        return self.effective + (self.block_size if self.drops_last else 0) + 1


def effective_block(block_size: int, *, stated: int | None = None, groups: Iterable[int] = ()) -> int:
    """The hit granularity of a server hashing in `block_size` blocks: the LCM of what its /metrics
    `stated` (vLLM's alignment, or its attention and Mamba blocks) and the block sizes of the
    KV-cache groups its events name (`groups`); never finer than `block_size` (a chain cannot say
    less). Sizes that are not positive are left out.

    A build that hits finer than its groups' blocks (`--prefix-match-unit`) is not modelled: its
    hits are taken at the coarser granularity."""
    return lcm(block_size, *(size for size in (stated or 0, *groups) if size > 0))
