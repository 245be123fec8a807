"""Whether a server's hit counter is wired: a state of its collection, not a miss.

Some engines report no prefix-cache hits at all while they reuse prefixes (vLLM on hybrid and MTP
models in public issues: `prefix_cache_hits_total` flat while TTFT falls from 5.5 s to 0.8 s on a
repeat). Their requests' `cached_tokens` then say 0 for prompts the engine did reuse, and every one
would be called a miss. The evidence it is the counter and not the cache: no request reported a
cached token, while requests whose leading block the server had seen before (repeats) got their
first token much sooner than first sightings did.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_EACH = 5  # repeats and first sightings needed before their TTFTs are compared
FASTER = 0.5  # repeats' median TTFT at most this share of first sightings' says "reused"
MIN_SAVED_SECONDS = 0.05  # ... and this much sooner: a few milliseconds either way are the network's


@dataclass(frozen=True, slots=True)
class CounterEvidence:
    """A server's requests over a window: the cached tokens they reported, and the median TTFT of
    its repeats and of its first sightings (None when there were none)."""

    requests: int
    cached_tokens: int
    repeats: int
    repeat_ttft: float | None
    firsts: int
    first_ttft: float | None


def counter_not_wired(evidence: CounterEvidence) -> bool:
    """True when the engine reported no hit while its repeats were much faster: at least MIN_EACH
    repeats and first sightings, no cached token reported, and the repeats' median TTFT at most
    FASTER of the first sightings' and MIN_SAVED_SECONDS sooner (a server answering in milliseconds
    either way shows no reuse, only noise). Too few requests of either kind say nothing (False)."""
    if evidence.cached_tokens or evidence.repeats < MIN_EACH or evidence.firsts < MIN_EACH:
        return False
    if evidence.repeat_ttft is None or evidence.first_ttft is None or evidence.first_ttft <= 0:
        return False
    saved = evidence.first_ttft - evidence.repeat_ttft
    return evidence.repeat_ttft <= FASTER * evidence.first_ttft and saved >= MIN_SAVED_SECONDS
