"""Block rounding: how many tokens vLLM can reuse or must reserve, in whole blocks."""

from __future__ import annotations


def _check(tokens: int, block_size: int) -> None:
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if tokens < 0:
        raise ValueError(f"a token count cannot be negative, got {tokens}")


def full_blocks(tokens: int, block_size: int) -> int:
    """Return how many full blocks ``tokens`` tokens fill (rounded down).

    Raises ValueError when tokens < 0 or block_size <= 0.
    """
    _check(tokens, block_size)
    return tokens // block_size


def blocks_to_reserve(tokens: int, block_size: int) -> int:
    """Return how many blocks hold ``tokens`` tokens, a partial last block included.

    0 for 0 tokens. Raises ValueError when tokens < 0 or block_size <= 0.
    """
    _check(tokens, block_size)
    return -(-tokens // block_size)


def reusable_tokens(matched_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Return the cached tokens vLLM reports when a prompt's first tokens match the cache.

    vLLM reuses whole blocks only, and never the last prompt token (its logits must be
    computed), so this is the full blocks of min(matched, prompt - 1); 0 for an empty
    prompt. Raises ValueError for negative counts or block_size <= 0.
    """
    _check(matched_tokens, block_size)
    _check(prompt_tokens, block_size)
    if prompt_tokens == 0:
        return 0
    return full_blocks(min(matched_tokens, prompt_tokens - 1), block_size) * block_size


def cached_tokens_for_full_match(prompt_tokens: int, block_size: int) -> int:
    """Return the cached tokens of a prompt whose every block is resident.

    floor((n - 1) / block_size) * block_size, e.g. 191 tokens with blocks of 32 give 160;
    0 for an empty prompt. Raises ValueError for a negative count or block_size <= 0.
    """
    return reusable_tokens(prompt_tokens, prompt_tokens, block_size)
