"""`Lines` into the replay's `TraceRequest`s at one block size, in arrival order.

A request's chain is the engine's hashes when the file has them at that block size, else its token
ids chained here (chains.py), scoped by model and salt as vLLM scopes its hashes; a request with
neither has no known blocks (the replay gives its blocks keys no other request shares).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from app.analyzer.chains import chain_keys, scope_key
from app.analyzer.lines import Line, Lines
from app.domain.replay.trace import TraceRequest


@dataclass(frozen=True, slots=True)
class Built:
    """The trace's requests in arrival order, each one's token ids (a view, None without them),
    and what the caller should be told about how they were built."""

    requests: list[TraceRequest]
    token_ids: list[npt.NDArray[np.int32] | None]
    block_size: int
    notes: list[str]


def ints(keys: Sequence[Hashable]) -> Sequence[int]:
    """A chain's keys as what they are in the analyzer: ints (chains.py, or the engine's hashes).
    The replay's requests type their keys as any hashable value."""
    return cast(Sequence[int], keys)


def build_requests(lines: Lines, block_size: int) -> Built:
    """The trace of `lines` at `block_size` (see the module's docstring). Lines without an arrival
    time keep their place in the file (one second apart, after any timed line)."""
    read = lines.lines
    notes: list[str] = []
    untimed = sum(1 for line in read if line.arrived is None)
    if untimed:
        notes.append(f"{untimed} request(s) had no arrival time: they are taken in file order.")
    latest = max((line.arrived for line in read if line.arrived is not None), default=0.0)
    arrivals = [line.arrived if line.arrived is not None else latest + n for n, line in enumerate(read)]
    order = sorted(range(len(read)), key=arrivals.__getitem__)
    chained = [n for n in order if _needs_chain(read[n], block_size) and read[n].tokens is not None]
    keys = _chains(lines, chained, block_size)
    requests, token_ids, unknown = [], [], 0
    for n in order:
        line = read[n]
        salted, unsalted = keys.get(n) or _given(line, block_size)
        unknown += not salted and line.prompt_tokens >= block_size
        requests.append(TraceRequest(
            request_id=line.request_id, arrived=arrivals[n], prompt_tokens=line.prompt_tokens,
            server=line.server, group=line.group, salt=line.salt, tenant=line.tenant,
            template=line.template, session=line.session, output_tokens=line.output_tokens,
            held_seconds=line.held_seconds, block_size=block_size, block_hashes=salted,
            unsalted_hashes=unsalted, cached_tokens=line.cached_tokens,
        ))  # fmt: skip
        token_ids.append(lines.token_ids(line))
    if unknown:
        notes.append(
            f"{unknown} request(s) had neither token ids nor block hashes at block size {block_size}:"
            " their blocks are taken as shared with no other request."
        )
    return Built(requests, token_ids, block_size, notes)


def _needs_chain(line: Line, block_size: int) -> bool:
    return not (line.block_size == block_size and line.block_hashes)


def _given(line: Line, block_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The file's own hashes when at `block_size`, else none."""
    if line.block_size == block_size:
        return line.block_hashes, line.unsalted_hashes
    return (), ()


def _chains(
    lines: Lines, chosen: list[int], block_size: int
) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """The salted and salt-neutral chains of the chosen lines (neutral only where salted)."""
    if not chosen:
        return {}
    read = lines.lines
    tokens, spans = _aligned(lines, chosen, block_size)
    neutral = [scope_key(read[n].group) for n in chosen]
    salted = [scope_key(f"{read[n].group}\x1f{read[n].salt}") if read[n].salt else s
              for n, s in zip(chosen, neutral, strict=True)]  # fmt: skip
    scopes = [salted, neutral] if salted != neutral else [neutral]  # no salt: one chain serves both
    chains, offsets = chain_keys(tokens, spans, scopes, block_size)
    keys, unsalted_keys = chains[0], chains[-1]
    found = {}
    bounds = offsets.tolist()
    for position, n in enumerate(chosen):
        start, end = bounds[position], bounds[position + 1]
        chain = tuple(keys[start:end].tolist())
        found[n] = (chain, tuple(unsalted_keys[start:end].tolist()) if read[n].salt else ())
    return found


def _aligned(
    lines: Lines, chosen: list[int], block_size: int
) -> tuple[npt.NDArray[np.int32], list[tuple[int, int]]]:
    """The token buffer and the chosen lines' spans, every span starting on a block: the buffer
    as read when its padding fits the block size, else a copy padded to it."""
    spans = [lines.lines[n].tokens for n in chosen]
    if lines.align % block_size == 0:
        return lines.tokens, spans  # type: ignore[return-value]
    sizes = [end - start for start, end in spans]  # type: ignore[misc]
    padded = [size + -size % block_size for size in sizes]
    copy = np.zeros(sum(padded), dtype=np.int32)
    moved, at = [], 0
    for (start, end), size in zip(spans, padded, strict=True):  # type: ignore[misc]
        copy[at : at + end - start] = lines.tokens[start:end]
        moved.append((at, at + end - start))
        at += size
    return copy, moved
