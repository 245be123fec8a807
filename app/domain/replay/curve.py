"""Hit rate against KV capacity for every capacity at once, in one pass over a trace (Mattson's stack
algorithm), and where that pass is exact.

vLLM's free queue is an LRU whose order does not depend on its size: a finished request's blocks go
to its tail last block first, so with requests one at a time the cached blocks are always the most
recently released ones, a chain's parent newer than its child. A block is then resident at a
capacity of C blocks exactly when fewer than C cached blocks were released after it (its stack
distance), and a request reuses its leading blocks whose distances, and every earlier one's, are
within C. One pass computes each block's distance once (a Fenwick tree over release stamps) and
so the reuse at every C.

Exact for requests that release their blocks before the next arrives on their server; requests
that overlap hold blocks the LRU cannot give out, which a point replay (app/domain/replay/run.py)
models and this does not: `curve_error` says how far the two are apart on a given trace. One
block of each server is kept out of the capacity, the partial last block a request leaves free
at the head of the queue.

A server that rounds its hits (a hybrid model's effective block, EAGLE's dropped block) computes
again the resident blocks a rounded hit leaves out and caches them a second time: vLLM keeps both
copies, this pass one, so its curve reads somewhat high there (up to 2.3 points on
tests/domain/test_replay_whatif.py's trace); `curve_error` measures it on every what-if.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from app.domain.replay.trace import Key, TraceRequest, padded_keys, request_keys

try:  # the stack in C, built from app/domain/_stack.c at install when a compiler was at hand
    from app.domain._stack import Stack as _NativeStack
except ImportError:  # pragma: no cover - the extension is optional
    _NativeStack = None  # type: ignore[assignment, misc]


def stack_in_c() -> bool:
    """Whether the curve's stack is app/domain/_stack.c's (built at install), not the Python one."""
    return _NativeStack is not None


def _stack(releases: int) -> _StackDistances | _NativeStack:
    return _StackDistances(releases) if _NativeStack is None else _NativeStack(releases)


class _Fenwick:
    """Counts over positions 1..size: add one, take one, and count up to a position, in O(log n)."""

    __slots__ = ("size", "tree")

    def __init__(self, size: int) -> None:
        self.size = size
        self.tree = [0] * (size + 1)

    def add(self, position: int, delta: int) -> None:
        tree, size = self.tree, self.size
        while position <= size:
            tree[position] += delta
            position += position & -position

    def count_to(self, position: int) -> int:
        tree, total = self.tree, 0
        while position > 0:
            total += tree[position]
            position -= position & -position
        return total


class _StackDistances:
    """One server's LRU stack: each cached key's release stamp, and how many are newer."""

    __slots__ = ("live", "stamps", "time", "tree")

    def __init__(self, releases: int) -> None:
        self.tree = _Fenwick(releases)
        self.stamps: dict[Hashable, int] = {}
        self.time = 0
        self.live = 0

    def distances(self, keys: Sequence[Hashable], limit: int, floor: int | None = None) -> list[int]:
        """How many cached blocks are as new as each of the first `limit` keys or newer (itself
        included), up to the first key never released; with `floor`, each one's running maximum
        from it (what holds that key and every one before it)."""
        found = []
        for key in keys[:limit]:
            stamp = self.stamps.get(key)
            if stamp is None:
                break
            found.append(self.live - self.tree.count_to(stamp - 1))
        return found if floor is None else list(accumulate(found, max, initial=floor))[1:]

    def release(self, keys: Sequence[Hashable]) -> None:
        """Put `keys` at the new end, the last one first (vLLM frees a request's blocks in reverse)."""
        tree, stamps = self.tree, self.stamps
        for key in reversed(keys):
            old = stamps.get(key)
            if old is None:
                self.live += 1
            else:
                tree.add(old, -1)
            self.time += 1
            stamps[key] = self.time
            tree.add(self.time, 1)


@dataclass(frozen=True, slots=True)
class CapacityCurve:
    """Reused tokens by the capacity that first holds them: `reused_at(blocks)` for any capacity."""

    block_size: int
    prompt_tokens: int
    reusable_at: dict[str, Counter[int]]  # per server process (epoch_name): tokens reused at this many blocks

    def reused_at(self, blocks: dict[str, int]) -> int:
        """Tokens reused when each server process has `blocks[epoch_name]` KV blocks (vLLM's
        num_gpu_blocks)."""
        total = 0
        for server, needed in self.reusable_at.items():
            capacity = blocks.get(server, 0) - 2  # the null block, and the partial one left free
            total += sum(tokens for distance, tokens in needed.items() if distance <= capacity)
        return total

    def hit_rate_at(self, blocks: dict[str, int]) -> float | None:
        """Reused over prompt tokens at that capacity; None without prompt tokens."""
        return self.reused_at(blocks) / self.prompt_tokens if self.prompt_tokens else None


def epoch_name(server: str, restarts: int) -> str:
    """The curve's name of a server's process after `restarts` restarts: its own name first, then
    `server#1`, `server#2`... (each process its own capacity: a cut restarts with fewer blocks)."""
    return server if restarts == 0 else f"{server}#{restarts}"


def capacity_curve(
    trace: Sequence[TraceRequest],
    *,
    block_size: int,
    salted: bool = True,
    counted: Callable[[TraceRequest], bool] | None = None,
    restarts: Sequence[tuple[float, str]] = (),
    rounding: Mapping[str, tuple[int, bool]] | None = None,
) -> CapacityCurve:
    """One pass over `trace` in arrival order, each request on the server it was recorded on; the
    reuse of the requests `counted` says (all by default), every request taking its room. At each
    of `restarts` (time, server) the server starts anew, its cache empty: its requests after it are
    counted under `epoch_name(server, n)`, so that a capacity can be given to each process.
    `rounding`: how a server rounds its hits, (hit unit in blocks, drops the last block), as
    ServerShape says; a server not in it hits whole blocks."""
    rounding = {s: r for s, r in (rounding or {}).items() if r != (1, False)}
    order = sorted(trace, key=lambda request: request.arrived)
    chains = [padded_keys(r, request_keys(r, block_size, salted=salted), block_size) for r in order]
    releases: Counter[str] = Counter()
    for request, keys in zip(order, chains, strict=True):
        releases[request.server] += len(keys) + request.output_tokens // block_size + 1
    stacks = {server: _stack(count) for server, count in releases.items()}
    epochs = dict.fromkeys(releases, 0)
    reusable: dict[str, Counter[int]] = {server: Counter() for server in releases}  # blocks, then tokens
    emptied = deque(sorted((at, server) for at, server in restarts if server in stacks))
    for request, keys in zip(order, chains, strict=True):
        while emptied and emptied[0][0] <= request.arrived:  # a new process: its cache empty
            server = emptied.popleft()[1]
            stacks[server] = _stack(releases[server])
            epochs[server] += 1
        stack = stacks[request.server]
        needed = reusable.setdefault(epoch_name(request.server, epochs[request.server]), Counter())
        if counted is not None and not counted(request):
            stack.release([*keys, *_output_keys(request, block_size)])
            continue
        # A leading block is reused at the capacity holding it and every block before it; a
        # prompt reuses nothing where it does not fit at all (a pool of fewer blocks than it needs).
        fits = -(-request.prompt_tokens // block_size) - 1
        found = stack.distances(keys, max(request.prompt_tokens - 1, 0) // block_size, fits)
        if request.server in rounding:
            found = _rounded(found, *rounding[request.server])
        needed.update(found)
        stack.release([*keys, *_output_keys(request, block_size)])
    prompt_tokens = sum(r.prompt_tokens for r in trace if counted is None or counted(r))
    tokens = {
        server: Counter({at: n * block_size for at, n in blocks.items()})
        for server, blocks in reusable.items()
    }
    return CapacityCurve(block_size, prompt_tokens, tokens)


def _rounded(distances: Sequence[int], unit: int, drops_last: bool) -> list[int]:
    """The distances of the leading blocks a hit keeps once the server rounds it: with the first
    `hit` blocks resident (a capacity of `distances[hit - 1]`), it drops the last one when
    `drops_last`, then keeps whole multiples of `unit` (vLLM's `find_longest_cache_hit`)."""
    kept: list[int] = []
    for hit, distance in enumerate(distances, start=1):
        blocks = hit - 1 if drops_last else hit
        kept.extend([distance] * (blocks // unit * unit - len(kept)))
    return kept


def _output_keys(request: TraceRequest, block_size: int) -> list[Key]:
    """The blocks a request's output fills, cached under keys no other request has."""
    filled = (request.prompt_tokens + max(request.output_tokens - 1, 0)) // block_size
    return [
        (request.request_id, "output", index) for index in range(request.prompt_tokens // block_size, filled)
    ]
