"""How long prompt token ids are kept: the privacy rule, in one place. Pure.

Prompt token ids are prompt text. They are kept for `days` after a request arrived (0: not at
all), and never in hash-only mode; block hashes outlive them, so divergence still works to block
precision once they are gone.
"""

from datetime import datetime, timedelta


def token_ids_cutoff(now: datetime, *, days: int, hash_only: bool) -> datetime | None:
    """Token ids of what arrived at or after the answer are kept; None keeps none."""
    if hash_only or days <= 0:
        return None
    return now - timedelta(days=days)


def keeps_token_ids(arrived_at: datetime, cutoff: datetime | None) -> bool:
    """Whether token ids of something that arrived at `arrived_at` are kept under `cutoff`."""
    return cutoff is not None and arrived_at >= cutoff
