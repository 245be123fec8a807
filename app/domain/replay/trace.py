"""A request trace as the replay reads it, whatever it came from: the server's stored records, a
JSON-lines file of the offline analyzer, a simulator run.

A request's blocks are named by keys of a hash chain. Where the engine's own hashes are known
(`block_hashes`, at the block size it served with) the replay uses them as they are, so a request
hits in the replay exactly when it could have on the engine. With token ids the replay can chain
them itself at any block size (`token_chain`), scoped by compatibility group and salt as vLLM
scopes its hashes; a request with neither is replayed as a prompt no other shares.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

Key = Hashable
"""A block's key in a chain: an engine's wire hash, the replay's own (token_chain), or a block of
unknown content no other request shares."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    `arrived`: seconds on any clock the trace shares. `server`: the one it was routed to ('' when
    not known). `group`: requests of different groups never share blocks (the model, a LoRA
    adapter). `salt`: the cache salt ('' for none). `session`: what affinity routing keeps
    together ('' for none: the tenant and template then). `held_seconds`: how long it held its
    blocks (0: released at once). `block_hashes`: the engine's chain at `block_size`, salted as
    the engine hashed it; `unsalted_hashes` the same chain without the salt, when known.
    `cached_tokens`: what the engine reported it reused (None when not reported).
    """

    request_id: str
    arrived: float
    prompt_tokens: int
    server: str = ""
    group: str = ""
    salt: str = ""
    tenant: str = ""
    template: str = ""
    session: str = ""
    output_tokens: int = 0
    held_seconds: float = 0.0
    block_size: int = 0
    block_hashes: tuple[Key, ...] = ()
    unsalted_hashes: tuple[Key, ...] = ()
    token_ids: tuple[int, ...] | None = None
    cached_tokens: int | None = None

    @property
    def affinity(self) -> str:
        """The key session and consistent-hash routing keep on one server."""
        return self.session or f"{self.tenant}\x1f{self.template}"


def token_chain(token_ids: Sequence[int], block_size: int, *, scope: str = "") -> tuple[Key, ...]:
    """Keys of every full block of `token_ids`: each block's key hashes its parent's key with its
    tokens, the first one `scope` (a group and salt), as vLLM chains its blocks. Python's tuple hash:
    the same tokens give the same keys within a process, which is all a replay needs."""
    keys: list[Key] = []
    key = hash(scope)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        key = hash((key, tuple(token_ids[start : start + block_size])))
        keys.append(key)
    return tuple(keys)


def request_keys(request: TraceRequest, block_size: int, *, salted: bool = True) -> tuple[Key, ...]:
    """The chain a replay at `block_size` gives `request`: the engine's hashes when they are at
    that block size (`salted` False: the unsalted chain when the request was salted), else its
    token ids chained in the scope of its group (and salt); () when neither is known, so it
    reuses nothing and nothing reuses it."""
    if request.block_size == block_size and request.block_hashes:
        if salted or not request.salt:
            return request.block_hashes
        if request.unsalted_hashes:
            return request.unsalted_hashes
    if request.token_ids is None:
        return ()
    # An unsalted request and a salted one with its salt dropped share one scope: the group's.
    scope = f"{request.group}\x1f{request.salt}" if salted and request.salt else request.group
    return token_chain(request.token_ids, block_size, scope=scope)


def padded_keys(request: TraceRequest, keys: tuple[Key, ...], block_size: int) -> tuple[Key, ...]:
    """`keys` cut or lengthened to the request's full prompt blocks: blocks whose content is not
    known get keys of their own (`request_id`, index), so they take room in the cache as they did
    on the engine, and nothing else can hit them."""
    full = request.prompt_tokens // block_size
    if len(keys) >= full:
        return keys[:full]
    return keys + tuple((request.request_id, index) for index in range(len(keys), full))
