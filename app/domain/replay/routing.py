"""How a replayed request picks its server: as recorded, or by one of the policies routers use.

Load is what a server is busy with when the request arrives (requests running or waiting for
blocks); ties go to the server given the fewest requests so far, then the lowest index, so a
trace whose requests release their blocks at once still spreads evenly.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from app.domain.replay.trace import Key, TraceRequest


class Routing(StrEnum):
    RECORDED = "recorded"
    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"
    SESSION = "session"
    CONSISTENT_HASH = "consistent_hash"
    PREFIX_AWARE = "prefix_aware"


ROUTING_LABELS = {
    Routing.RECORDED: "as recorded",
    Routing.RANDOM: "random",
    Routing.ROUND_ROBIN: "round robin",
    Routing.LEAST_LOADED: "least loaded",
    Routing.SESSION: "session affinity",
    Routing.CONSISTENT_HASH: "consistent hash",
    Routing.PREFIX_AWARE: "prefix-aware",
}

DEFAULT_LOAD_CAP = 1.5
"""Prefix-aware routing skips a server busier than this many times the fleet's mean load (plus
one request): llm-d's and Dynamo's routers weigh the prefix they find against the queue."""


class ServerView:
    """What a router may look at of a server: its load, and how much of a chain it holds."""

    def load(self) -> int:
        raise NotImplementedError

    def resident(self, keys: Sequence[Key]) -> int:
        raise NotImplementedError


@dataclass(slots=True)
class Router:
    """Chooses servers for requests by one policy; `names` are the servers' (for RECORDED)."""

    routing: Routing
    names: Sequence[str]
    seed: int = 0
    load_cap: float = DEFAULT_LOAD_CAP
    assigned: list[int] = field(init=False)
    sessions: dict[str, int] = field(default_factory=dict, init=False)
    _by_name: dict[str, int] = field(init=False)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.assigned = [0] * len(self.names)
        self._by_name = {name: index for index, name in enumerate(self.names)}
        self._rng = random.Random(self.seed)

    def choose(self, request: TraceRequest, keys: Sequence[Key], servers: Sequence[ServerView]) -> int:
        """The index of the server `request` goes to."""
        server = self._pick(request, keys, servers)
        self.assigned[server] += 1
        return server

    def _pick(self, request: TraceRequest, keys: Sequence[Key], servers: Sequence[ServerView]) -> int:
        count = len(servers)
        match self.routing:
            case Routing.RECORDED:
                found = self._by_name.get(request.server)
                return found if found is not None else _rendezvous(request.server, count)
            case Routing.RANDOM:
                return self._rng.randrange(count)
            case Routing.ROUND_ROBIN:
                return sum(self.assigned) % count
            case Routing.LEAST_LOADED:
                return self._least_loaded(servers, range(count))
            case Routing.SESSION:
                affinity = request.affinity
                if affinity not in self.sessions:
                    self.sessions[affinity] = self._least_loaded(servers, range(count))
                return self.sessions[affinity]
            case Routing.CONSISTENT_HASH:
                return _rendezvous(request.affinity, count)
            case Routing.PREFIX_AWARE:
                return self._prefix_aware(keys, servers)
        raise ValueError(f"unknown routing {self.routing!r}")

    def _least_loaded(self, servers: Sequence[ServerView], candidates: Sequence[int]) -> int:
        return min(candidates, key=lambda s: (servers[s].load(), self.assigned[s], s))

    def _prefix_aware(self, keys: Sequence[Key], servers: Sequence[ServerView]) -> int:
        """The server holding the longest leading run of the chain, among those not overloaded;
        ties (no prefix anywhere, say) to the least loaded."""
        loads = [server.load() for server in servers]
        cap = self.load_cap * sum(loads) / len(loads) + 1
        candidates = [s for s, load in enumerate(loads) if load <= cap]
        held = {s: servers[s].resident(keys) for s in candidates}
        return min(candidates, key=lambda s: (-held[s], loads[s], self.assigned[s], s))


def _rendezvous(key: str, count: int) -> int:
    """Highest-random-weight hashing: a key keeps its server when others are added or removed
    (only the keys of a removed server move), with a hash that is the same in every process."""

    def weight(server: int) -> bytes:
        return hashlib.blake2b(f"{server}\x1f{key}".encode(), digest_size=8).digest()

    return max(range(count), key=weight)
