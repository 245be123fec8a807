"""The synthetic trace of bench_analysis: prompts of 8 templates, written as JSON lines both
Prefixscope's import (bench_analysis) and prefixlens' `analyze` read.

Each template has a stable prefix of 512-3,000 tokens; a request is its template's prefix and a
tail of 64-400 tokens of its own. From the middle of the trace on, templates 2 and 5 carry 6
volatile tokens at token 40 (an id or a timestamp near the top). Token ids are drawn from GPT-2's
vocabulary (50,257), so the killers search can decode them with the bundled tokenizer when no
server answers /detokenize.

A line holds what a server reports of a request: `request_id`, `arrived_at` (ISO 8601), `server`,
`model`, `tags` (`{"template": ...}`, a tag axis for prefixlens), `prompt_tokens`, `cached_tokens`
and the prompt's `token_ids` (prefixlens' own field name). `cached_tokens` is what an unlimited
prefix cache of that block size reuses: the longest run of full blocks, from the first, that an
earlier request of the trace had; so one file per block size.
"""

import random
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import msgspec

TEMPLATES = 8
VOLATILE = (2, 5)  # the templates that gain a volatile insertion from the middle on
VOLATILE_AT = 40  # its first token
VOLATILE_TOKENS = 6
VOCABULARY = 50_257  # GPT-2's
SERVER = "bench"
MODEL = "bench"
SEED = 5  # its prefixes (630-2,683 tokens) make 20,000 requests about 36 million tokens


def prompts(requests: int, *, seed: int = SEED) -> Iterator[tuple[int, list[int]]]:
    """(template, token ids) of each request, in arrival order."""
    rng = random.Random(seed)
    lengths = [rng.randrange(512, 3001) for _ in range(TEMPLATES)]
    prefixes = [[rng.randrange(VOCABULARY) for _ in range(length)] for length in lengths]
    for n in range(requests):
        template = n % TEMPLATES
        tokens = list(prefixes[template])
        if template in VOLATILE and n >= requests // 2:
            tokens[VOLATILE_AT:VOLATILE_AT] = [rng.randrange(VOCABULARY) for _ in range(VOLATILE_TOKENS)]
        tokens += [rng.randrange(VOCABULARY) for _ in range(rng.randrange(64, 401))]
        yield template, tokens


class UnlimitedCache:
    """Which block prefixes earlier prompts had: a prefix cache that never evicts."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._seen: set[int] = set()

    def admit(self, tokens: Sequence[int]) -> int:
        """Tokens of `tokens` reused (full blocks from the first, each seen before); then all its full
        blocks are cached. A block is known by its whole prefix (a hash chain, Python's tuple hash)."""
        size, key, cached, hit = self.block_size, 0, 0, True
        for start in range(0, len(tokens) - size + 1, size):
            key = hash((key, tuple(tokens[start : start + size])))
            if hit and key in self._seen:
                cached += size
            else:
                hit = False
                self._seen.add(key)
        return cached


def write_traces(
    folder: Path, *, requests: int, block_sizes: Sequence[int], start: datetime, seconds: float
) -> tuple[dict[int, Path], int]:
    """Write the trace once per block size (`trace-<requests>-<block size>.jsonl` in `folder`),
    arrivals spread evenly over `seconds` from `start`; returns the files and the total prompt tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {size: folder / f"trace-{requests}-{size}.jsonl" for size in block_sizes}
    caches = {size: UnlimitedCache(size) for size in block_sizes}
    files = {size: path.open("wb") for size, path in paths.items()}
    encoder, total = msgspec.json.Encoder(), 0
    try:
        for n, (template, tokens) in enumerate(prompts(requests)):
            total += len(tokens)
            line: dict[str, object] = {
                "request_id": f"r{n:06d}", "server": SERVER, "model": MODEL,
                "arrived_at": (start + timedelta(seconds=seconds * n / requests)).isoformat(),
                "tags": {"template": f"template-{template}"}, "prompt_tokens": len(tokens),
            }  # fmt: skip
            for size, out in files.items():
                line["cached_tokens"] = caches[size].admit(tokens)
                out.write(encoder.encode({**line, "token_ids": tokens}) + b"\n")
    finally:
        for out in files.values():
            out.close()
    return paths, total
