"""The wire side of vLLM's KV-cache events, pure: event maps, msgpack batches, sequence numbers
and the replay buffer. No sockets here; the ZMQ server layer sends what these functions make.

vLLM 0.32 encodes a batch with msgspec as the positional array ``[ts, [events], dp_rank]`` and
each event as a map whose first key is ``type`` (shared/reference/vllm-surface.md, 2.4 and V).
Before vLLM PR #42892 the events themselves were positional arrays; ``array_form=True`` makes
that legacy shape for old consumers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import msgspec

logger = logging.getLogger(__name__)

KVEventData: TypeAlias = dict[str, Any]
"""One event as vLLM's msgspec struct encodes it in map form: ``type`` first, then its fields
in declaration order, defaulted fields left out when None."""

MEDIUM_GPU: Final = "GPU"
FULL_ATTENTION: Final = "full_attention"
MAMBA: Final = "mamba"
"""vLLM's KVCacheSpecKind values (vllm/v1/kv_cache_interface.py) of the groups the simulator sends."""

# Field order of vLLM's event structs, for the legacy array form. Fields after the first
# defaulted one (index) have a None default and are dropped from the tail when None.
_FIELDS: Final[dict[str, tuple[tuple[str, ...], int]]] = {
    "BlockStored": (
        (
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
            "extra_keys",
            "group_idx",
            "kv_cache_spec_kind",
            "kv_cache_spec_sliding_window",
        ),
        7,
    ),
    "BlockRemoved": (("block_hashes", "medium", "group_idx"), 2),
    "AllBlocksCleared": ((), 0),
}

REPLAY_END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends a replay answer (eight 0xFF bytes)."""

_encoder = msgspec.msgpack.Encoder()


def block_stored(
    *,
    block_hashes: list[int],
    parent_block_hash: int | None,
    token_ids: list[int],
    block_size: int,
    lora_id: int | None,
    lora_name: str | None,
    extra_keys: list[list[str] | None],
    group_idx: int = 0,
    kind: str = FULL_ATTENTION,
) -> KVEventData:
    """Return a BlockStored event as vLLM 0.32 emits it for blocks of one KV-cache group: of a
    one-group model, group 0 of full attention.

    ``extra_keys`` has one entry per block (None, or the block's keys such as ``["tenant-a"]``);
    vLLM always sends it, along with ``group_idx`` and the group's spec kind (one event per group
    on a hybrid model, in group order).
    """
    return {
        "type": "BlockStored",
        "block_hashes": block_hashes,
        "parent_block_hash": parent_block_hash,
        "token_ids": token_ids,
        "block_size": block_size,
        "lora_id": lora_id,
        "medium": MEDIUM_GPU,
        "lora_name": lora_name,
        "extra_keys": extra_keys,
        "group_idx": group_idx,
        "kv_cache_spec_kind": kind,
    }


def block_removed(block_hash: int, *, group_idx: int = 0) -> KVEventData:
    """Return a BlockRemoved event; vLLM sends one per evicted block, so it carries one hash, and
    of its group only its index (no kind)."""
    return {
        "type": "BlockRemoved",
        "block_hashes": [block_hash],
        "medium": MEDIUM_GPU,
        "group_idx": group_idx,
    }


def offloaded_stored(block_hash: int, *, medium: str) -> KVEventData:
    """Return the BlockStored vLLM 0.32's OffloadingConnector publishes for a block copied to a lower
    tier: a placeholder of one hash, no parent, no tokens, block size 0, the tier's medium
    (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py, _placeholder_stored)."""
    return {
        "type": "BlockStored", "block_hashes": [block_hash], "parent_block_hash": None, "token_ids": [],
        "block_size": 0, "lora_id": None, "medium": medium, "lora_name": None, "group_idx": 0,
    }  # fmt: skip


def offloaded_removed(block_hash: int, *, medium: str) -> KVEventData:
    """Return the BlockRemoved of a lower tier's copy dropped (the same connector's shape)."""
    return {"type": "BlockRemoved", "block_hashes": [block_hash], "medium": medium, "group_idx": 0}


def key_only_removed(keys: Sequence[tuple[int, int]], *, medium: str) -> KVEventData:
    """Return a lower tier's BlockRemoved in the shape proposed for vLLM's offload events (RFC #49413,
    shared/reference/field-2026-12.md 1.1): ``block_hashes`` holds OffloadKeys, (block hash, group
    index) pairs, where vLLM 0.32 sends hashes. A decoder of 0.32's layout cannot read it (Prefixscope
    rejects it as ``kv_field_invalid``): the demo's undecodable events from a newer engine."""
    return {"type": "BlockRemoved", "block_hashes": [list(key) for key in keys], "medium": medium}


def all_blocks_cleared() -> KVEventData:
    """Return the AllBlocksCleared event of a prefix-cache reset."""
    return {"type": "AllBlocksCleared"}


def to_array_form(event: KVEventData) -> list[Any]:
    """Return ``event`` as a legacy positional array: the type, then the fields in declaration
    order, trailing defaulted fields dropped while None (msgspec's ``omit_defaults``).

    Raises ValueError for an unknown event type. Unknown keys are left out.
    """
    kind = event.get("type")
    if kind not in _FIELDS:
        raise ValueError(f"unknown KV event type {kind!r}")
    names, first_defaulted = _FIELDS[kind]
    values = [event.get(name) for name in names]
    while len(values) > first_defaulted and values[-1] is None:
        values.pop()
    return [kind, *values]


def encode_batch(
    ts: float, events: Sequence[KVEventData], dp_rank: int | None, *, array_form: bool = False
) -> bytes:
    """Return the msgpack payload of one batch, byte for byte as vLLM's msgspec encoder makes it.

    ``ts`` is always encoded as a float64 (vLLM stamps ``time.time()``). A None ``dp_rank`` is
    left out (``[ts, events]``), as vLLM's ``omit_defaults`` does. Events are encoded in the
    order given; their maps keep their key order. Raises ValueError for an unknown event type
    when ``array_form`` is set.
    """
    body: list[Any] = [to_array_form(e) for e in events] if array_form else list(events)
    batch: list[Any] = [float(ts), body]
    if dp_rank is not None:
        batch.append(dp_rank)
    return _encoder.encode(batch)


def seq_frame(seq: int) -> bytes:
    """Return the 8-byte big-endian sequence frame of batch ``seq``.

    Raises OverflowError for a negative seq or one beyond 2**64 - 1.
    """
    return seq.to_bytes(8, "big")


class Sequencer:
    """Numbers the batches of one publisher: 0, 1, 2, ... (vLLM restarts at 0 per process)."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def next_seq(self) -> int:
        """Return the next batch's sequence number."""
        seq = self._next
        self._next += 1
        return seq


class ReplayBuffer:
    """The last ``capacity`` published batches, for answers to replay requests.

    As in vLLM, a batch older than the buffer is silently gone: ``since`` returns what remains.
    """

    __slots__ = ("_batches",)

    def __init__(self, capacity: int) -> None:
        """Raises ValueError when capacity < 1."""
        if capacity < 1:
            raise ValueError(f"a replay buffer holds at least one batch, got capacity {capacity}")
        self._batches: deque[tuple[int, bytes]] = deque(maxlen=capacity)

    def append(self, seq: int, payload: bytes) -> None:
        """Keep one published batch, dropping the oldest when full.

        Sequence numbers are expected to grow; ``since`` relies on it.
        """
        self._batches.append((seq, payload))

    def since(self, start_seq: int) -> list[tuple[int, bytes]]:
        """Return the kept ``(seq, payload)`` pairs with ``seq >= start_seq``, oldest first.

        Empty when ``start_seq`` is beyond the newest batch.
        """
        return [(seq, payload) for seq, payload in self._batches if seq >= start_seq]

    def __len__(self) -> int:
        return len(self._batches)
