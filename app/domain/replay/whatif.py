"""What another fleet configuration would have reused of the same traffic, and what that is worth.

A what-if replays a window of requests (app/domain/replay/run.py) first as the fleet was (the
calibration: how far to trust the rest), then under each alternative: KV blocks per server from a
quarter to four times today (point replays, and the one-pass curve between them), each routing
policy, fewer larger or more smaller servers of the same total memory, other block sizes of the
same memory (over the servers that kept their requests' token ids), and salts dropped (what
isolation costs). Each answer is priced against the replay of the fleet as it was, with the
product's one cost model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from app.domain.cost import prefill_price
from app.domain.replay.calibration import Calibration, Trust, calibrate
from app.domain.replay.curve import capacity_curve, epoch_name
from app.domain.replay.routing import ROUTING_LABELS, Routing
from app.domain.replay.run import ReplayResult, Restart, ServerShape, Setup, replay
from app.domain.replay.trace import TraceRequest

CAPACITY_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
CURVE_STEPS = 48  # one-pass curve points between the smallest and largest factor
BLOCK_SIZES = (8, 16, 32, 64)
LEAVES_OUT = (
    "Time to first token saved is the prefill of the tokens reused, at the prefill rate priced with; "
    "it leaves out queueing, which more reuse also shortens, and the decode that follows."
)


class Kind(StrEnum):
    AS_WAS = "as_was"
    CAPACITY = "capacity"
    ROUTING = "routing"
    SERVERS = "servers"
    BLOCK_SIZE = "block_size"
    SALTS = "salts"
    RESTORE = "restore"


@dataclass(frozen=True, slots=True)
class Price:
    """What a prefill token costs: the measured (or configured) rate and the GPU-hour price."""

    tokens_per_second: float
    gpu_hour_price: float
    rate_source: str = "measured"

    def __str__(self) -> str:
        source = "measured on the window's requests" if self.rate_source == "measured" else "configured"
        return (
            f"priced at {self.tokens_per_second:,.0f} prefill tokens a second ({source}) and "
            f"${self.gpu_hour_price:,.2f} a GPU-hour"
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """One configuration's replay, priced against the fleet as it was: positive saves, negative costs."""

    kind: Kind
    label: str
    factor: float | None  # capacity: KV blocks as a multiple of today's
    hit_rate: float | None
    reused_tokens: int
    saved_tokens_per_hour: float
    gpu_seconds_per_hour: float
    money_per_hour: float
    ttft_saved_seconds: float  # per request, on average: the prefill of the extra tokens reused
    mean_wait_seconds: float  # waiting for free blocks, per request


@dataclass(frozen=True, slots=True)
class CurvePoint:
    factor: float
    hit_rate: float | None


@dataclass(frozen=True, slots=True)
class WhatIf:
    """Every answer for one window, with the calibration that says how far to trust them."""

    requests: int
    prompt_tokens: int
    window_seconds: float
    block_size: int
    servers: tuple[ServerShape, ...]
    restarts: tuple[Restart, ...]  # servers started anew in the window, as replayed
    calibration: Calibration
    as_was: Answer
    capacity: tuple[Answer, ...]
    curve: tuple[CurvePoint, ...]
    curve_error_points: float | None  # the one-pass curve against the point replays, at worst
    routing: tuple[Answer, ...]
    server_counts: tuple[Answer, ...]
    block_sizes: tuple[Answer, ...]  # over the servers that kept every request's token ids
    salts: tuple[Answer, ...]  # empty unless a request was salted
    restored: tuple[Answer, ...] = ()  # servers given back the KV blocks they had before
    # Servers whose requests the block sizes leave out: some of them kept no token ids.
    block_sizes_left_out: tuple[str, ...] = ()
    leaves_out: str = LEAVES_OUT
    price: Price | None = None  # what priced the answers (None: kept by a version that did not say)

    @property
    def blocks_now(self) -> dict[str, int]:
        """Each server's KV blocks as the window ended: its last restart's, else its first."""
        found = {s.name: s.num_blocks for s in self.servers}
        for restart in sorted(self.restarts, key=lambda r: r.at):
            found[restart.server] = restart.num_blocks
        return found

    @property
    def trusted(self) -> bool:
        """False when the replay did not reproduce the fleet: the answers are then not to be read."""
        return self.calibration.trust in (Trust.GOOD, Trust.FAIR)


Progress = Callable[[float], None]


def what_if(
    trace: Sequence[TraceRequest],
    *,
    servers: Sequence[ServerShape],
    block_size: int,
    window_seconds: float,
    restarts: Sequence[Restart] = (),
    price: Price,
    counted: Callable[[TraceRequest], bool] | None = None,
    restore: Mapping[str, int] | None = None,
    uncompared: Sequence[str] = (),
    progress: Progress | None = None,
) -> WhatIf:
    """Replay `trace` (the window's requests) as the fleet of `servers` was, then every alternative.
    `counted`: the requests the answers are about (a template's, say), all by default; every request
    is replayed, as each competes for the same blocks. `restore`: KV blocks some servers had before
    (a capacity cut, a restart with other flags), answered as giving them back. `uncompared`: servers
    whose reported reuse the calibration leaves out (calibrate). `progress(share)` is told how far
    along it is (0 to 1)."""
    if window_seconds <= 0:
        raise ValueError(f"a window must last, got {window_seconds} s")
    base = Setup(tuple(servers), block_size, restarts=tuple(restarts))
    asked = _Asking(trace, counted, base, window_seconds, price, progress)
    mask = asked.mask
    as_was_run = asked.run(asked.base)
    as_was = asked.answer(Kind.AS_WAS, "as it was", as_was_run)
    capacity = tuple(asked.capacity(factor) for factor in CAPACITY_FACTORS)
    curve, curve_error = asked.curve(capacity)
    block_sizes, left_out = asked.block_sizes()
    answers = WhatIf(
        requests=sum(mask),
        prompt_tokens=asked.prompt_tokens,
        window_seconds=window_seconds,
        block_size=block_size,
        servers=tuple(servers),
        restarts=tuple(restarts),
        calibration=calibrate(
            [r for r, c in zip(trace, mask, strict=True) if c],
            asked.counted(as_was_run),
            uncompared=uncompared,
        ),
        as_was=as_was,
        capacity=capacity,
        curve=curve,
        curve_error_points=curve_error,
        routing=tuple(asked.routing(routing) for routing in Routing),
        server_counts=asked.server_counts(),
        block_sizes=block_sizes,
        salts=asked.salts(),
        restored=asked.restored(restore or {}),
        block_sizes_left_out=left_out,
        price=price,
    )
    if progress is not None:
        progress(1.0)
    return answers


class _Asking:
    """One what-if's trace, base setup, pricing and progress; each method one family of answers."""

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        counted: Callable[[TraceRequest], bool] | None,
        base: Setup,
        window_seconds: float,
        price: Price,
        progress: Progress | None,
    ) -> None:
        self.trace = trace
        self.is_counted = counted
        self.mask = [counted is None or counted(r) for r in trace]
        mask = self.mask
        self.requests = max(sum(mask), 1)
        self.prompt_tokens = sum(r.prompt_tokens for r, c in zip(trace, mask, strict=True) if c)
        self.base = base
        self.window_seconds = window_seconds
        self.price = price
        self.progress = progress
        self.baseline_tokens: int | None = None
        self.done = 0
        self.total = 1 + len(CAPACITY_FACTORS) + len(Routing) + 3 + len(BLOCK_SIZES) + 3

    def run(self, setup: Setup) -> ReplayResult:
        result = replay(self.trace, setup)
        self.done += 1
        if self.progress is not None:
            self.progress(min(self.done / self.total, 0.99))
        return result

    def counted(self, result: ReplayResult) -> list[int]:
        """The reuse of the counted requests, in trace order."""
        return [reused for reused, c in zip(result.reused, self.mask, strict=True) if c]

    def answer(self, kind: Kind, label: str, result: ReplayResult, factor: float | None = None) -> Answer:
        reused = sum(self.counted(result))
        if self.baseline_tokens is None:
            self.baseline_tokens = reused
        extra = reused - self.baseline_tokens
        per_hour = extra * 3600 / self.window_seconds
        gpu_seconds, money = prefill_price(
            per_hour, tokens_per_second=self.price.tokens_per_second, gpu_hour_price=self.price.gpu_hour_price
        )
        requests = self.requests
        waited = sum(w for w, c in zip(result.waited, self.mask, strict=True) if c)
        return Answer(
            kind=kind,
            label=label,
            factor=factor,
            hit_rate=reused / self.prompt_tokens if self.prompt_tokens else None,
            reused_tokens=reused,
            saved_tokens_per_hour=per_hour,
            gpu_seconds_per_hour=gpu_seconds,
            money_per_hour=money,
            ttft_saved_seconds=extra / requests / self.price.tokens_per_second,
            mean_wait_seconds=waited / requests,
        )

    def capacity(self, factor: float) -> Answer:
        setup = self._resized(lambda name, blocks: scaled_blocks(blocks, factor))
        label = "today's KV blocks" if factor == 1 else f"{factor:g}x KV blocks"
        return self.answer(Kind.CAPACITY, label, self.run(setup), factor)

    def _resized(self, blocks: Callable[[str, int], int], **changes: Any) -> Setup:
        """The base setup with each server's blocks, and those it restarts with, given by `blocks`."""
        servers = tuple(replace(s, num_blocks=blocks(s.name, s.num_blocks)) for s in self.base.servers)
        restarts = tuple(replace(r, num_blocks=blocks(r.server, r.num_blocks)) for r in self.base.restarts)
        return replace(self.base, servers=servers, restarts=restarts, **changes)

    def curve(self, points: Sequence[Answer]) -> tuple[tuple[CurvePoint, ...], float | None]:
        """The one-pass curve from the smallest to the largest factor, and its worst distance (in
        points) from the point replays, which it is checked against on every what-if."""
        curve = capacity_curve(
            self.trace,
            block_size=self.base.block_size,
            salted=self.base.salted,
            counted=self.is_counted,
            restarts=[(r.at, r.server) for r in self.base.restarts],
            rounding={s.name: (s.hit_unit(self.base.block_size), s.drops_last) for s in self.base.servers},
        )
        low, high = CAPACITY_FACTORS[0], CAPACITY_FACTORS[-1]
        factors = sorted(
            {*CAPACITY_FACTORS, *(low + (high - low) * i / CURVE_STEPS for i in range(CURVE_STEPS + 1))}
        )
        found = tuple(CurvePoint(f, curve.hit_rate_at(self._blocks(f))) for f in factors)
        errors = [
            abs(curve_rate - point.hit_rate) * 100
            for point in points
            if point.factor is not None
            and point.hit_rate is not None
            and (curve_rate := curve.hit_rate_at(self._blocks(point.factor))) is not None
        ]
        return found, max(errors) if errors else None

    def routing(self, routing: Routing) -> Answer:
        return self.answer(
            Kind.ROUTING, ROUTING_LABELS[routing], self.run(replace(self.base, routing=routing))
        )

    def server_counts(self) -> tuple[Answer, ...]:
        """The same total KV memory in fewer larger or more smaller servers, routed prefix-aware."""
        count = len(self.base.servers)
        total = sum(s.num_blocks for s in self.base.servers)
        # Replicas of one model: they round hits as the servers did when all did alike, else plainly.
        rounds = {(s.effective_block, s.drops_last) for s in self.base.servers}
        effective, drops_last = rounds.pop() if len(rounds) == 1 else (0, False)
        answers = []
        for servers in sorted({1, max(count // 2, 1), count, count * 2}):
            blocks = max(total // servers, 2)
            shapes = tuple(ServerShape(f"replica-{n}", blocks, effective, drops_last) for n in range(servers))
            # Other servers than those that ran: the recorded restarts do not map onto them.
            setup = replace(self.base, servers=shapes, routing=Routing.PREFIX_AWARE, restarts=())
            label = f"{servers} server{'s' if servers > 1 else ''} x {blocks:,} blocks, prefix-aware"
            answers.append(self.answer(Kind.SERVERS, label, self.run(setup)))
        return tuple(answers)

    def block_sizes(self) -> tuple[tuple[Answer, ...], tuple[str, ...]]:
        """Other block sizes in the same KV memory, and the servers they leave out. Re-cutting
        blocks needs a request's token ids, so they are answered over the servers that kept every
        request's: routed as recorded, each server's cache holds its own requests alone. Left out,
        a server's requests go, and the answers are priced against the others' replay today."""
        left_out = tuple(sorted({r.server for r in self.trace if r.token_ids is None}))
        if not left_out:
            return self._block_sizes(), ()
        kept = tuple(s for s in self.base.servers if s.name not in left_out)
        trace = [r for r in self.trace if r.server not in left_out]
        if not kept or self.base.routing is not Routing.RECORDED:
            return (), left_out
        restarts = tuple(r for r in self.base.restarts if r.server not in left_out)
        base = replace(self.base, servers=kept, restarts=restarts)
        others = _Asking(trace, self.is_counted, base, self.window_seconds, self.price, self.progress)
        if not any(others.mask):
            return (), left_out
        self.total += 1  # their replay today
        others.done, others.total = self.done, self.total  # the progress goes on where it was
        others.answer(Kind.AS_WAS, "as it was", others.run(base))  # what their answers are priced against
        answers = others._block_sizes()
        self.done = others.done
        return answers, left_out

    def _block_sizes(self) -> tuple[Answer, ...]:
        answers = []
        for size in BLOCK_SIZES:
            label = f"blocks of {size} tokens" + (" (today)" if size == self.base.block_size else "")
            same_memory = functools.partial(_resized_blocks, old=self.base.block_size, new=size)
            setup = self._resized(same_memory, block_size=size)
            answers.append(self.answer(Kind.BLOCK_SIZE, label, self.run(setup)))
        return tuple(answers)

    def salts(self) -> tuple[Answer, ...]:
        """Every salt dropped, then each salted tenant's alone: the reuse their isolation costs. Only
        where a request was salted."""
        tenants = sorted({r.tenant for r in self.trace if r.salt})
        if not tenants:
            return ()
        answers = [self.answer(Kind.SALTS, "every salt off", self.run(replace(self.base, salted=False)))]
        for tenant in tenants if len(tenants) > 1 else ():
            setup = replace(self.base, unsalted_tenants=frozenset({tenant}))
            answers.append(self.answer(Kind.SALTS, f"{tenant or 'untenanted'}'s salt off", self.run(setup)))
        return tuple(answers)

    def restored(self, restore: Mapping[str, int]) -> tuple[Answer, ...]:
        """Servers given back the blocks they had (at the window's start and at each restart), one
        answer for them all."""
        had = [(s.name, s.num_blocks) for s in self.base.servers] + [
            (r.server, r.num_blocks) for r in self.base.restarts
        ]
        given = {name: restore[name] for name, blocks in had if restore.get(name, 0) > blocks}
        if not given:
            return ()
        setup = self._resized(lambda name, blocks: max(blocks, given.get(name, 0)))
        label = "restore " + ", ".join(
            f"{name} to {blocks:,} blocks" for name, blocks in sorted(given.items())
        )
        return (self.answer(Kind.RESTORE, label, self.run(setup)),)

    def _blocks(self, factor: float) -> dict[str, int]:
        """Each server process's blocks at `factor` (its restarts' their own), as the curve names them."""
        found = {s.name: scaled_blocks(s.num_blocks, factor) for s in self.base.servers}
        restarted: dict[str, int] = {}
        for restart in sorted(self.base.restarts, key=lambda r: r.at):
            restarted[restart.server] = restarted.get(restart.server, 0) + 1
            found[epoch_name(restart.server, restarted[restart.server])] = scaled_blocks(
                restart.num_blocks, factor
            )
        return found


def _resized_blocks(name: str, blocks: int, *, old: int, new: int) -> int:
    """A pool's blocks at another block size in the same memory (at least one usable)."""
    return max(blocks * old // new, 2)


def scaled_blocks(num_blocks: int, factor: float) -> int:
    """`factor` times a pool's usable blocks, plus vLLM's null block (at least one usable)."""
    return max(round((num_blocks - 1) * factor), 1) + 1
