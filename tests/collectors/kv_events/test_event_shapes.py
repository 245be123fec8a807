"""The KV decoder against every event shape vLLM and its look-alikes publish or have published.

Each shape is built with msgspec from a documented field list (the source is named beside it), encoded
as the publisher encodes it, and decoded by collectors/kv_events/parse.py: every field the publisher
sends must land in the event, and fields the decoder does not know pass through without a rejection.
Field lists: shared/reference/vllm-surface.md section 2 (vllm/distributed/kv_events.py, PR #42892 and
the field history it lists) and shared/reference/field-2026-12.md section 1.1.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from collectors.kv_events.parse import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, decode_batch

TOKENS = list(range(100, 132))  # two 16-token blocks
HASHES = [15760518052499183552, 42]  # uint64, one above 2**63 as vLLM sends them


# --- vLLM since PR #42892 (map-encoded, tag field "type", omit_defaults): vllm/distributed/kv_events.py


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class StoredMap(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class StoredMapWithSession(StoredMap, tag="BlockStored"):
    """vLLM #51381 / #57339 (and SGLang #37482): ``session_id`` on BlockStored, type undocumented."""

    session_id: str | None = None


class StoredMapFuture(StoredMap, tag="BlockStored"):
    """Fields proposed after the survey (vllm-surface.md section 2, all unconfirmed): must pass through."""

    session_id: str | None = None
    ownership: dict[str, Any] | None = None
    locality: str | None = None
    origin: str | None = None


class StoredMapSGLang(StoredMap, tag="BlockStored"):
    """SGLang's map form (#37482, RFC #39991): ``cache_salt`` beside ``extra_keys``, not a vLLM field."""

    cache_salt: str | None = None
    session_id: str | None = None


class RemovedMap(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class RemovedMapFuture(RemovedMap, tag="BlockRemoved"):
    """vLLM PR #55092 (open) and SGLang #39620 (open): copy counts and a removal reason."""

    remaining_copy_counts: list[int] | None = None
    reason: str | None = None


class RemovedMapSGLang(_Event, tag="BlockRemoved"):
    """SGLang's BlockRemoved as issue #39604 quotes it (block_hashes, medium; no group_idx) with the
    removal reason PR #39620 (open) adds: its description names capacity eviction and demotion, the
    issue release, abort and clear (collectors/kv_events/parse.py reads their usual spellings)."""

    block_hashes: list[int]
    medium: str | None = None
    reason: str | None = None


class ClearedMap(_Event, tag="AllBlocksCleared"):
    pass


# --- vLLM before PR #42892 (array_like, the same fields by position), and the field history it lists


class _Array(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class StoredArray(_Array, tag="BlockStored"):
    """#16750 base, #19737 medium, #27577 lora_name, #33304 extra_keys, #37688 group_idx, #40984 kinds."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class StoredArrayOldest(_Array, tag="BlockStored"):
    """vLLM about 0.9 (#16750): five fields, no medium."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class RemovedArray(_Array, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class ClearedArray(_Array, tag="AllBlocksCleared"):
    pass


def stored_fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "block_hashes": HASHES, "parent_block_hash": None, "token_ids": TOKENS, "block_size": 16,
        "lora_id": None, "medium": "GPU", "lora_name": None,
    }  # fmt: skip
    return {**fields, **changes}


SHAPES = [
    pytest.param(
        {
            "type": "BlockStored",
            "block_hashes": HASHES,
            "parent_block_hash": None,
            "token_ids": TOKENS,
            "block_size": 16,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [None, None],
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        },
        id="vllm-0.26-observed-kthena-1535",
    ),
    pytest.param(StoredMap(**stored_fields()), id="vllm-map-defaults-omitted"),
    pytest.param(
        StoredMap(
            **stored_fields(
                parent_block_hash=7,
                lora_id=3,
                lora_name="ada",
                medium="CPU",
                extra_keys=[("ada", "tenant-a"), ("ada",)],
                group_idx=2,
                kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=4096,
            )
        ),
        id="vllm-map-every-field-hybrid-group",
    ),
    pytest.param(
        StoredMap(**stored_fields(group_idx=1, kv_cache_spec_kind="mamba")), id="vllm-map-mamba-group"
    ),
    pytest.param(StoredMapWithSession(**stored_fields(session_id="conv-9")), id="vllm-map-session-id"),
    pytest.param(
        StoredMapFuture(
            **stored_fields(session_id="s", ownership={"owner": [1]}, locality="LOCAL", origin="NEW")
        ),
        id="vllm-map-unconfirmed-future-fields",
    ),
    pytest.param(
        StoredMapSGLang(**stored_fields(cache_salt="t-a", session_id="s-2", extra_keys=[("t-a",), None])),
        id="sglang-map-cache-salt-and-session",
    ),
    pytest.param(
        StoredArray(
            **stored_fields(
                extra_keys=[None, ("salt",)],
                group_idx=1,
                kv_cache_spec_kind="mla_attention",
                kv_cache_spec_sliding_window=128,
            )
        ),
        id="vllm-array-every-field",
    ),
    pytest.param(StoredArray(**stored_fields(medium=None)), id="vllm-array-trailing-defaults-dropped"),
    pytest.param(
        StoredArrayOldest(**{k: v for k, v in stored_fields().items() if k not in ("medium", "lora_name")}),
        id="vllm-0.9-array-five-fields",
    ),
    pytest.param(
        ["BlockStored", HASHES, 0, TOKENS, 16, None, "GPU", None, None], id="llm-d-sim-array-nine-elements"
    ),
    pytest.param(
        RemovedMap(block_hashes=[HASHES[0]], medium="GPU", group_idx=3), id="vllm-map-removed-group"
    ),
    pytest.param(RemovedMap(block_hashes=[5], medium="CPU"), id="vllm-map-removed-cpu-tier"),
    pytest.param(
        RemovedMapFuture(
            block_hashes=[5], medium="GPU", group_idx=0, remaining_copy_counts=[1], reason="demoted"
        ),
        id="removed-with-copy-counts-and-reason",
    ),
    pytest.param(
        RemovedMapSGLang(block_hashes=[5], medium="GPU", reason="demoted"), id="sglang-removed-demoted"
    ),
    pytest.param(RemovedMapSGLang(block_hashes=[5, 6], reason="released"), id="sglang-removed-released"),
    pytest.param(RemovedArray(block_hashes=[5, 6], medium="GPU", group_idx=1), id="vllm-array-removed-group"),
    pytest.param(["BlockRemoved", [5], "GPU"], id="llm-d-sim-array-removed"),
    pytest.param(ClearedMap(), id="vllm-map-all-cleared"),
    pytest.param(ClearedArray(), id="vllm-array-all-cleared"),
    pytest.param({"type": "AllBlocksCleared", "medium": "CPU"}, id="all-cleared-naming-a-tier"),
]

DATACLASS = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def sent_fields(shape: Any) -> tuple[str, dict[str, Any]]:
    """The event's type and the fields the publisher puts on the wire (read back from the msgpack it
    encodes: omitted defaults are absent), positions named after vLLM's struct order."""
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(shape))
    if isinstance(wire, dict):
        return wire.pop("type"), wire
    structs = {"BlockStored": StoredArray, "BlockRemoved": RemovedArray, "AllBlocksCleared": ClearedArray}
    order = [f.name for f in msgspec.structs.fields(structs[wire[0]])]  # type: ignore[arg-type]
    return wire[0], dict(zip(order, wire[1:], strict=False))


def landed(event: KVEvent, name: str) -> Any:
    value = getattr(event, name)
    if name == "extra_keys" and value is not None:
        return [None if key is None else list(key) for key in value]
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("shape", SHAPES)
def test_every_documented_event_shape_decodes_with_every_field_landing(shape: Any) -> None:
    kind, sent = sent_fields(shape)
    batch = decode_batch(msgspec.msgpack.encode([1795988020.5, [shape], 0]))
    assert batch.rejected == ()
    [event] = batch.events
    assert type(event) is DATACLASS[kind]
    known = {f.name for f in dataclasses.fields(event)}
    for name, value in sent.items():
        if name not in known:
            continue  # a field the decoder does not keep: passed through, nothing rejected
        if name == "parent_block_hash" and value == 0:
            value = None  # llm-d's simulator sends 0 for "no parent"
        assert landed(event, name) == value, name
    for name in known - set(sent):  # what the publisher left out reads as unknown, never made up
        assert getattr(event, name) is None, name


def test_the_shapes_cover_every_field_the_decoder_keeps() -> None:
    """A field added to the decoder needs a shape above that carries it."""
    carried = {name for param in SHAPES for name in sent_fields(param.values[0])[1]}
    kept = {f.name for cls in DATACLASS.values() for f in dataclasses.fields(cls)}
    assert kept <= carried


@pytest.mark.parametrize(
    ("documented", "decoded"),
    [(StoredMapWithSession, BlockStored), (RemovedMap, BlockRemoved), (StoredArray, BlockStored)],
)
def test_every_documented_vllm_field_is_kept(documented: type[msgspec.Struct], decoded: type[Any]) -> None:
    """vLLM's own fields (hybrid groups, tiers, adapters, sessions) are evidence, not noise to drop."""
    kept = {f.name for f in dataclasses.fields(decoded)}
    assert {f.name for f in msgspec.structs.fields(documented)} <= kept
