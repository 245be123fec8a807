"""The miss causes of a trace's requests: the server's diagnosis (app/domain/misscauses.py), its KV
events made by a replay of the trace (app/domain/replay/run.py) instead of collected.

The replay stores and evicts blocks as each server's vLLM would at the capacity given; those
events go to a `FleetHistory` in time order with the requests, which it diagnoses as the server
diagnoses its records: a lost block seen before and since evicted is `evicted`, one resident on
another server `routed_elsewhere`, one never seen the prompt's own (`prompt_changed`, `cold`,
`salt`). What a request reused is what the trace says the engine reused (`cached_tokens`), else
what the replay reused.

Without a capacity the cache is unlimited: nothing is evicted, and the replay is the set of blocks
each server has stored (a pool of a billion blocks would not fit in memory).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.analyzer.trace import Built, ints
from app.domain.fleetblocks import EventKind
from app.domain.leading import leading
from app.domain.misscauses import FleetHistory
from app.domain.misses import Diagnosis, Unknown, reusable_blocks
from app.domain.replay.pool import PoolObserver
from app.domain.replay.run import ReplayWatch, ServerShape, Setup, replay
from app.domain.replay.trace import TraceRequest, padded_keys, request_keys
from app.domain.requestprompt import RequestPrompt


@dataclass(frozen=True, slots=True)
class Diagnosed:
    """Each request's diagnosis and replayed reuse (tokens), in the trace's order, and the blocks
    each server stored (the most of them hold the whole trace unevicted: tally.py's footprint)."""

    diagnoses: list[Diagnosis | Unknown]
    replayed: list[int]
    stored: list[int]  # by server, in server_names' order (with a capacity: the keys any stored)


def server_names(requests: Sequence[TraceRequest]) -> list[str]:
    """The trace's servers, sorted ("" for requests that name none)."""
    return sorted({request.server for request in requests})


def diagnose_trace(built: Built, *, blocks: int | None) -> Diagnosed:
    """Diagnose every request of `built`, the servers holding `blocks` blocks each (None: unlimited)."""
    names = server_names(built.requests)
    if blocks is None:
        return _unlimited(built, {name: n for n, name in enumerate(names)})
    setup = Setup(servers=tuple(ServerShape(name, blocks) for name in names), block_size=built.block_size)
    watch = _EventLog(built)
    result = replay(built.requests, setup, watch=watch)
    return watch.diagnosed(result.reused, result.servers, len(names))


def diagnose_part(built: Built, indices: Sequence[int]) -> Diagnosed:
    """Diagnose the requests at `indices` of `built` alone, the cache unlimited: an independent
    part of the trace (parts.py) gets the diagnoses the whole trace's history would give it."""
    return _unlimited(built, {name: n for n, name in enumerate(server_names(built.requests))}, indices)


def _prompt(built: Built, index: int, server: int, cached: int) -> RequestPrompt:
    request = built.requests[index]
    return RequestPrompt(
        server=server, arrived_at=_at(request.arrived), block_size=built.block_size,
        prompt_tokens=request.prompt_tokens, cached_tokens=cached, block_hashes=ints(request.block_hashes),
        salt=request.salt, neutral_hashes=ints(request.unsalted_hashes), family=request.template or None,
        token_ids=built.token_ids[index], key=index,
    )  # fmt: skip


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _history(servers: int) -> FleetHistory:
    # One compatibility group: the chains are scoped by model and salt already.
    return FleetHistory(dict.fromkeys(range(servers), "trace"))


def _unlimited(built: Built, servers: dict[str, int], indices: Sequence[int] | None = None) -> Diagnosed:
    """Recorded routing, nothing evicted: a server reuses the leading blocks it ever stored. Of the
    requests at `indices` (all by default): their diagnoses and replayed reuse in that order, and
    the blocks each server stored of theirs (`stored`). What a server holds is the history's own
    record of it: a second set of the same blocks cost as much again to fill."""
    history = _history(len(servers))
    size = built.block_size
    diagnoses: list[Diagnosis | Unknown] = []
    replayed: list[int] = []
    for index in range(len(built.requests)) if indices is None else indices:
        request = built.requests[index]
        server = servers[request.server]
        held = history.resident(server)
        keys = request.block_hashes
        hit = leading(keys[: reusable_blocks(request.prompt_tokens, size)], held)
        replayed.append(hit * size)
        cached = request.cached_tokens if request.cached_tokens is not None else hit * size
        diagnoses.append(history.diagnose(_prompt(built, index, server, cached)))
        full = request.prompt_tokens // size
        known = hit + leading(keys[hit:full], held)  # its leading run held, stepped over in C
        if known < full:  # the rest, mostly a new tail: the history stores what it does not hold
            stored = ints(keys[known:full])
            history.apply_blocks(server, 0, 0, _at(request.arrived), EventKind.STORED, stored)
    return Diagnosed(diagnoses, replayed, [len(history.resident(server)) for server in servers.values()])


class _EventLog(ReplayWatch):
    """The replay's arrivals and pool events in order, fed to the diagnosis once the replay has
    said what each request reused."""

    def __init__(self, built: Built) -> None:
        self.built = built
        # (kind, server, payload): an arrival's request index, a store's (index, start, end), a removed key
        self.log: list[tuple[int, int, Any]] = []
        self.stored_most = 0

    def observer(self, server: int) -> PoolObserver:
        return _Observer(self.log, server)

    def arriving(self, index: int, server: int) -> None:
        self.log.append((0, server, index))

    def diagnosed(self, reused: list[int], chosen: list[int], servers: int) -> Diagnosed:
        history = _history(servers)
        diagnoses: list[Diagnosis | Unknown | None] = [None] * len(self.built.requests)
        requests = self.built.requests
        now = _at(requests[0].arrived) if requests else _at(0)
        stored: set[Hashable] = set()
        for kind, server, payload in self.log:
            if kind == 0:
                index = payload
                request = requests[index]
                now = _at(request.arrived)
                cached = request.cached_tokens if request.cached_tokens is not None else reused[index]
                diagnoses[index] = history.diagnose(_prompt(self.built, index, server, cached))
            elif kind == EventKind.STORED:
                index, start, end = payload
                keys = ints(requests[index].block_hashes[start:end])  # the prompt's known blocks among them
                stored.update(keys)
                history.apply_blocks(server, 0, 0, now, EventKind.STORED, keys)
            else:
                history.apply_blocks(server, 0, 0, now, EventKind.REMOVED, [payload])
        found = [d if d is not None else Unknown.NO_PROMPT for d in diagnoses]
        return Diagnosed(found, reused, [len(stored)])  # a bound: the keys any server stored


class _Observer(PoolObserver):
    """One server's pool events into the log; blocks of unknown content (padding, output) left
    out: no other request can hit them, and the diagnosis knows only the prompts' chains."""

    def __init__(self, log: list[tuple[int, int, Any]], server: int) -> None:
        self.log = log
        self.server = server

    def stored(self, request_id: str, start: int, end: int) -> None:
        self.log.append((EventKind.STORED, self.server, (int(request_id), start, end)))

    def removed(self, key: Hashable) -> None:
        if isinstance(key, int):
            self.log.append((EventKind.REMOVED, self.server, key))


__all__ = ["Diagnosed", "diagnose_trace", "padded_keys", "request_keys", "server_names"]
