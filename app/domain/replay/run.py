"""A trace replayed through a fleet of vLLM prefix caches (app/domain/replay/pool.py), one per server.

Requests arrive in time order; the router picks a server; the request is admitted (its prefill:
the resident prefix reused, the rest allocated and stored), holds its blocks for `held_seconds`,
then its output fills blocks of its own (their content unknown: no other request hits them) and it
is released. A request that finds too few free blocks waits, as vLLM's scheduler keeps it waiting,
until a request on its server finishes. A prompt larger than a server's whole pool is never
admitted: it is counted apart (`unfit`), reusing nothing.

What it leaves out: chunked prefill, preemption, and the order of decode steps between requests
(a request's output blocks are all stored as it finishes).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace

from app.domain.hitblock import effective_block
from app.domain.replay.pool import SILENT, BlockPool, OutOfBlocks, PoolObserver
from app.domain.replay.routing import DEFAULT_LOAD_CAP, Router, Routing, ServerView
from app.domain.replay.trace import Key, TraceRequest, padded_keys, request_keys


@dataclass(frozen=True, slots=True)
class ServerShape:
    """A replayed server: its name and its KV blocks, counting vLLM's null block (num_gpu_blocks);
    how its cache rounds a hit: to whole `effective_block` tokens (a hybrid model's, 0 for a plain
    one, app/domain/hitblock.py) after dropping the last block matched when `drops_last` (EAGLE/MTP)."""

    name: str
    num_blocks: int
    effective_block: int = 0
    drops_last: bool = False

    def hit_unit(self, block_size: int) -> int:
        """Blocks of `block_size` a hit is a whole number of: 1 on a plain server."""
        return effective_block(block_size, stated=self.effective_block) // block_size


@dataclass(frozen=True, slots=True)
class Restart:
    """A server started anew at `at` (the trace's clock) with `num_blocks`: its cache empty, the
    requests it was running or keeping waiting lost (a restart, or a capacity cut, which is one)."""

    at: float
    server: str
    num_blocks: int


@dataclass(frozen=True, slots=True)
class Setup:
    """A fleet configuration to replay a trace under."""

    servers: tuple[ServerShape, ...]
    block_size: int
    routing: Routing = Routing.RECORDED
    restarts: tuple[Restart, ...] = ()
    salted: bool = True  # False: every request's salt dropped (what isolation costs)
    unsalted_tenants: frozenset[str] = frozenset()  # these tenants' salts dropped, the others' kept
    seed: int = 0
    load_cap: float = DEFAULT_LOAD_CAP

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("a replay needs at least one server")
        if self.block_size < 1:
            raise ValueError(f"block size must be positive, got {self.block_size}")


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """A replay's per-request answers and their totals."""

    setup: Setup
    reused: list[int]
    servers: list[int]
    waited: list[float]
    unfit: int
    prompt_tokens: int
    reused_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reused_tokens", sum(self.reused))

    @property
    def hit_rate(self) -> float | None:
        """Reused over prompt tokens; None for a trace without prompt tokens."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else None


class ReplayWatch:
    """What a caller may watch of a replay (the offline analyzer joins its diagnosis to it): each
    server's pool events, and each request as it arrives, before it is admitted. Watches nothing."""

    def observer(self, server: int) -> PoolObserver:
        """The observer of server `server`'s pool (request ids are the requests' indices in the trace)."""
        return SILENT

    def arriving(self, index: int, server: int) -> None:
        """Request `index` arrives, routed to `server`: every event before it was reported."""


def replay(trace: Sequence[TraceRequest], setup: Setup, *, watch: ReplayWatch | None = None) -> ReplayResult:
    """Replay `trace` (in any order: it is taken by arrival) under `setup`."""
    return _Replay(trace, setup, watch or ReplayWatch()).run()


class _Server(ServerView):
    __slots__ = ("pool", "waiting")

    def __init__(self, shape: ServerShape, block_size: int, observer: PoolObserver) -> None:
        self.pool = BlockPool(
            block_size, shape.num_blocks, observer=observer, hit_unit=shape.hit_unit(block_size),
            drops_last=shape.drops_last,
        )  # fmt: skip
        self.waiting: deque[int] = deque()

    def load(self) -> int:
        return self.pool.running + len(self.waiting)

    def resident(self, keys: Sequence[Key]) -> int:
        return self.pool.resident(keys)


class _Replay:
    """The state of one replay: servers, router, requests running and waiting."""

    def __init__(self, trace: Sequence[TraceRequest], setup: Setup, watch: ReplayWatch) -> None:
        self.trace = trace
        self.setup = setup
        self.watch = watch
        self.servers = [
            _Server(shape, setup.block_size, watch.observer(index))
            for index, shape in enumerate(setup.servers)
        ]
        self.router = Router(setup.routing, [s.name for s in setup.servers], setup.seed, setup.load_cap)
        self.reused = [0] * len(trace)
        self.chosen = [-1] * len(trace)
        self.waited = [0.0] * len(trace)
        self.keys: list[tuple[Key, ...]] = [()] * len(trace)
        self.running: list[tuple[float, int]] = []  # (finish time, request index): a heap
        self.unfit = 0
        by_name = {shape.name: index for index, shape in enumerate(setup.servers)}
        self.restarts = deque(
            (r.at, by_name[r.server], r.num_blocks)
            for r in sorted(setup.restarts, key=lambda r: r.at)
            if r.server in by_name
        )

    def run(self) -> ReplayResult:
        order = sorted(range(len(self.trace)), key=lambda index: self.trace[index].arrived)
        for index in order:
            request = self.trace[index]
            self._finish_until(request.arrived)
            self._restart_until(request.arrived)
            keys = self._keys(index, request)
            server = self.router.choose(request, keys, self.servers)
            self.chosen[index] = server
            self.watch.arriving(index, server)
            self._arrive(index, server, request.arrived)
        self._finish_until(float("inf"))
        prompt_tokens = sum(request.prompt_tokens for request in self.trace)
        return ReplayResult(self.setup, self.reused, self.chosen, self.waited, self.unfit, prompt_tokens)

    def _keys(self, index: int, request: TraceRequest) -> tuple[Key, ...]:
        size = self.setup.block_size
        salted = self.setup.salted and request.tenant not in self.setup.unsalted_tenants
        keys = padded_keys(request, request_keys(request, size, salted=salted), size)
        self.keys[index] = keys
        return keys

    def _arrive(self, index: int, server: int, now: float) -> None:
        target = self.servers[server]
        if target.waiting or not self._admit(index, server, now):
            target.waiting.append(index)

    def _admit(self, index: int, server: int, now: float) -> bool:
        """Prefill the request if its server has room (True), releasing it at once when it holds
        its blocks for no time; False when it must wait. A prompt no server can hold is unfit."""
        request = self.trace[index]
        pool = self.servers[server].pool
        request_id = str(index)
        try:
            hit = pool.admit(request_id, self.keys[index], max(request.prompt_tokens, 1))
        except OutOfBlocks:
            return False
        except ValueError:
            self.unfit += 1
            return True
        self.reused[index] = hit * self.setup.block_size
        self.waited[index] = now - request.arrived
        if request.held_seconds > 0:
            heapq.heappush(self.running, (now + request.held_seconds, index))
        else:
            self._release(index, server)
        return True

    def _release(self, index: int, server: int) -> None:
        """Decode the request's output (blocks of its own) and free its blocks."""
        pool = self.servers[server].pool
        request_id = str(index)

        def own(block: int) -> Hashable:
            return (request_id, "output", block)

        try:
            for _ in range(self.trace[index].output_tokens):
                pool.append_token(request_id, own)
        except OutOfBlocks:
            pass  # vLLM would preempt; here the request stops growing and finishes
        pool.finish(request_id)

    def _finish_until(self, until: float) -> None:
        """Release every request due by `until`, admitting the waiters its blocks make room for."""
        while self.running and self.running[0][0] <= until:
            finished_at, index = heapq.heappop(self.running)
            server = self.chosen[index]
            self._release(index, server)
            self._admit_waiting(server, finished_at)

    def _restart_until(self, until: float) -> None:
        """Start anew every server whose restart is due by `until`, dropping what it was running."""
        while self.restarts and self.restarts[0][0] <= until:
            _, server, num_blocks = self.restarts.popleft()
            self.running = [(at, index) for at, index in self.running if self.chosen[index] != server]
            heapq.heapify(self.running)
            observer = self.watch.observer(server)
            observer.cleared()  # a watcher's history of the server's blocks starts empty too
            shape = replace(self.setup.servers[server], num_blocks=num_blocks)  # the same engine, anew
            self.servers[server] = _Server(shape, self.setup.block_size, observer)

    def _admit_waiting(self, server: int, now: float) -> None:
        waiting = self.servers[server].waiting
        while waiting and self._admit(waiting[0], server, now):
            waiting.popleft()
