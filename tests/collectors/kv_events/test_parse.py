"""KV event decoding reproduces what a real vLLM server published (map form, array form, replay)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from app.domain.blockhash import hash_block, to_wire
from collectors.errors import KV_DECODE_REASONS, RejectReason
from collectors.kv_events.parse import (
    END_SEQ,
    HEAD_BYTES,
    REMOVAL_REASONS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVDecodeError,
    KVEvent,
    RemovalReason,
    decode_batch,
    decode_replay_reply,
    decode_sub_message,
    hash_from_bytes,
)
from tests.support.kv_captures import TOPIC, decoded_messages, live_frames, replay_frames

LIVE = live_frames()
DECODED = decoded_messages()
REPLAY = replay_frames()

# What the dataclasses keep of each event type; the capture also has "type".
KEPT = {
    "BlockStored": {f.name for f in dataclasses.fields(BlockStored)},
    "BlockRemoved": {f.name for f in dataclasses.fields(BlockRemoved)},
    "AllBlocksCleared": {f.name for f in dataclasses.fields(AllBlocksCleared)},
}


def as_captured(event: KVEvent) -> dict[str, Any]:
    """An event in the capture's JSON shape (lists, not tuples), limited to the fields we keep."""
    fields = dataclasses.asdict(event)
    if isinstance(event, BlockStored) and event.extra_keys is not None:
        fields["extra_keys"] = [None if k is None else list(k) for k in event.extra_keys]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def kept(captured: dict[str, Any]) -> dict[str, Any]:
    """The captured event as the dataclass keeps it: vLLM omits defaulted fields that are None."""
    return {k: captured.get(k) for k in KEPT[captured["type"]]}


def stored(**changes: Any) -> dict[str, Any]:
    """A well-formed map-form BlockStored of one 2-token block, with ``changes`` applied."""
    event = {
        "type": "BlockStored",
        "block_hashes": [2**64 - 1],
        "parent_block_hash": None,
        "token_ids": [1, 2],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    return {**event, **changes}


def removed(*hashes: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0}


def payload(*events: Any, dp_rank: int | None = 0) -> bytes:
    return msgspec.msgpack.encode([1795988020.5, list(events), dp_rank])


# --- the real captures ------------------------------------------------------------------------------


def test_every_captured_sub_message_decodes_to_the_captured_values() -> None:
    assert len(LIVE) == len(DECODED) == 24
    for frames, expected in zip(LIVE, DECODED, strict=True):
        message = decode_sub_message(frames)
        ts, events, dp_rank = expected["batch"]
        assert (message.topic, message.seq) == (expected["topic"], expected["seq"])
        assert (message.batch.ts, message.batch.dp_rank, message.batch.rejected) == (ts, dp_rank, ())
        assert [as_captured(e) for e in message.batch.events] == [kept(e) for e in events]
        assert [type(e).__name__ for e in message.batch.events] == [e["type"] for e in events]


def test_captured_events_carry_only_fields_we_keep_or_knowingly_drop() -> None:
    for message in DECODED:
        for event in message["batch"][1]:
            assert set(event) - KEPT[event["type"]] == {"type"}


def test_captured_stream_has_uint64_hashes_token_runs_and_salt_keys() -> None:
    events = [e for f in LIVE for e in decode_sub_message(f).batch.events]
    stores = [e for e in events if isinstance(e, BlockStored)]
    assert (len(stores), len(events) - len(stores)) == (23, 44)
    assert all(len(e.token_ids) == len(e.block_hashes) * e.block_size for e in stores)
    hashes = [h for e in events if not isinstance(e, AllBlocksCleared) for h in e.block_hashes]
    assert max(hashes) >= 2**63  # unsigned, not int64
    assert {e.extra_keys[0] for e in stores if e.extra_keys and e.extra_keys[0]} == {
        ("tenant-a",),
        ("tenant-b",),
    }


def test_token_ids_and_extra_keys_stay_out_of_repr() -> None:
    first = decode_sub_message(LIVE[0]).batch.events[0]
    assert isinstance(first, BlockStored)
    assert "token_ids" not in repr(first) and "extra_keys" not in repr(first)
    assert str(first.token_ids[0]) not in repr(first).replace(str(first.block_hashes), "")


def test_captured_replay_returns_the_live_batches_then_the_end_marker() -> None:
    replies = [decode_replay_reply(frames) for frames in REPLAY]
    assert [len(frames) for frames in REPLAY] == [4] * 25  # ["", topic, seq, payload]
    assert [r.seq for r in replies] == [*range(24), END_SEQ]
    assert [r.topic for r in replies] == [TOPIC] * 24 + [""]
    assert [r.batch for r in replies[:-1]] == [decode_sub_message(f).batch for f in LIVE]
    assert (replies[-1].end, replies[-1].batch) == (True, None)
    assert not any(r.end for r in replies[:-1])


@pytest.mark.parametrize(
    "reshape",
    [
        pytest.param(lambda f: [f[0], f[2], f[3]], id="vllm-source-delimiter-seq-payload"),
        pytest.param(lambda f: [f[1], f[2], f[3]], id="llm-d-topic-seq-payload"),
    ],
)
def test_three_frame_replay_replies_decode_like_the_captured_four(reshape: Any) -> None:
    for frames in REPLAY:
        four, three = decode_replay_reply(frames), decode_replay_reply(reshape(frames))
        assert (three.seq, three.batch, three.end) == (four.seq, four.batch, four.end)


# --- the legacy array form --------------------------------------------------------------------------

# vLLM's positional layout before PR #42892: the struct fields of vllm/distributed/kv_events.py in
# declaration order (shared/reference/vllm-surface.md 2.4), after the type name. Fields from
# extra_keys on have defaults, and msgspec's omit_defaults drops them from the end when they are nil.
ARRAY_ORDER = {
    "BlockStored": (
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
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
REQUIRED_POSITIONS = {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}


def to_vllm_array(event: dict[str, Any]) -> list[Any]:
    values = [event.get(name) for name in ARRAY_ORDER[event["type"]]]
    while len(values) > REQUIRED_POSITIONS[event["type"]] and values[-1] is None:
        values.pop()
    return [event["type"], *values]


def to_llm_d_array(event: dict[str, Any]) -> list[Any]:
    """llm-d-inference-sim's legacy form (reference 7.2): BlockStored always 9 elements, parent 0 = none."""
    if event["type"] != "BlockStored":
        return to_vllm_array(event)
    values = [event.get(name) for name in ARRAY_ORDER["BlockStored"][:8]]
    values[1] = values[1] or 0
    return ["BlockStored", *values]


def rewrite(message: dict[str, Any], convert: Any) -> bytes:
    ts, events, dp_rank = message["batch"]
    return msgspec.msgpack.encode([ts, [convert(e) for e in events], dp_rank])


def test_vllm_array_form_decodes_like_the_captured_map_form() -> None:
    for frames, message in zip(LIVE, DECODED, strict=True):
        assert decode_batch(rewrite(message, to_vllm_array)) == decode_batch(frames[2])


def test_the_captured_events_keep_their_kv_cache_group_kind() -> None:
    kinds = {
        (e.group_idx, e.kv_cache_spec_kind, e.block_size)
        for frames in LIVE
        for e in decode_batch(frames[2]).events
        if isinstance(e, BlockStored)
    }
    assert kinds == {(0, "full_attention", 32)}


def test_llm_d_array_form_decodes_with_parent_zero_as_no_parent() -> None:
    for frames, message in zip(LIVE, DECODED, strict=True):
        expected = [
            dataclasses.replace(e, group_idx=None, kv_cache_spec_kind=None)
            if isinstance(e, BlockStored)
            else e
            for e in decode_batch(frames[2]).events
        ]
        assert list(decode_batch(rewrite(message, to_llm_d_array)).events) == expected


def test_oldest_array_form_without_medium_and_batch_without_rank_decodes() -> None:
    batch = decode_batch(msgspec.msgpack.encode([1.0, [["BlockStored", [7], 5, [1, 2], 2, None]]]))
    assert batch.dp_rank is None
    assert batch.events == (
        BlockStored(
            block_hashes=(7,),
            parent_block_hash=5,
            token_ids=(1, 2),
            block_size=2,
            lora_id=None,
            lora_name=None,
            medium=None,
            group_idx=None,
            extra_keys=None,
        ),
    )


# --- forward compatibility and raw-bytes hashes -----------------------------------------------------


def test_unknown_keys_trailing_elements_and_newer_event_fields_are_ignored() -> None:
    plain = decode_batch(payload(stored(), removed(3)))
    newer = msgspec.msgpack.encode(
        [
            1795988020.5,
            [stored(session_id="s-1", ownership={"x": [1]}), {**removed(3), "remaining_copy_counts": [0]}],
            0,
            "a field after dp_rank",
        ]
    )
    arrays = payload(["BlockRemoved", [3], "GPU", 0, None, "future"])  # after group_idx, the reason
    first = plain.events[0]
    assert isinstance(first, BlockStored)
    assert decode_batch(newer).events == (
        dataclasses.replace(first, session_id="s-1"),
        plain.events[1],
    )
    assert decode_batch(arrays).events == plain.events[1:]


# SGLang's BlockRemoved (issue #39604: block_hashes, medium) with the removal reason its PR #39620 adds
# (open; its field name and values as the issue and the PR's description name them: the PR's code is
# not in any snapshot reachable here). Map form since SGLang #37482; the array form by position.
@pytest.mark.parametrize(
    ("event", "group", "reason"),
    [
        (
            {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU", "reason": "demoted"},
            None,
            RemovalReason.DEMOTED,
        ),
        ({**removed(3), "reason": "evicted"}, 0, RemovalReason.EVICTED),
        (["BlockRemoved", [3], "GPU", "released"], None, RemovalReason.RELEASED),  # SGLang's order
        (["BlockRemoved", [3], "GPU", 0, "abort"], 0, RemovalReason.ABORTED),  # vLLM's order, then reason
        (["BlockRemoved", [3], "GPU", 2], 2, None),  # vLLM's group_idx, no reason
        ({**removed(3), "reason": "Capacity-Eviction"}, 0, RemovalReason.EVICTED),
        ({**removed(3), "reason": "cleared"}, 0, RemovalReason.CLEARED),
        ({**removed(3), "reason": "tier_migration"}, 0, RemovalReason.UNKNOWN),  # a name not known yet
        ({**removed(3), "reason": 4}, 0, RemovalReason.UNKNOWN),  # an enum's number: its names unknown
        ({**removed(3), "reason": {"why": "x"}}, 0, RemovalReason.UNKNOWN),
        (["BlockRemoved", [3], "GPU", "x" * 300], None, RemovalReason.UNKNOWN),
        (removed(3), 0, None),  # vLLM: no reason said
    ],
)
def test_a_removal_reason_is_read_by_name_and_by_position_and_an_unknown_one_kept_as_unknown(
    event: Any, group: int | None, reason: RemovalReason | None
) -> None:
    batch = decode_batch(payload(event))
    assert batch.rejected == ()
    assert batch.events == (BlockRemoved(block_hashes=(3,), medium="GPU", group_idx=group, reason=reason),)


def test_every_documented_spelling_of_a_reason_reads_as_it() -> None:
    for spelling, reason in REMOVAL_REASONS.items():
        [event] = decode_batch(payload({**removed(3), "reason": spelling.upper()})).events
        assert isinstance(event, BlockRemoved) and event.reason == reason
    assert set(REMOVAL_REASONS.values()) == set(RemovalReason) - {RemovalReason.UNKNOWN}


def test_a_batch_mixing_map_and_array_events_decodes_them_all_in_order() -> None:
    # Neither whole-batch decoder takes it: the events are decoded one by one, none is rejected.
    batch = decode_batch(payload(removed(3), ["BlockRemoved", [4], "GPU", 0], stored()))
    assert batch.rejected == ()
    assert batch.events == (
        BlockRemoved(block_hashes=(3,), medium="GPU", group_idx=0),
        BlockRemoved(block_hashes=(4,), medium="GPU", group_idx=0),
        decode_batch(payload(stored())).events[0],
    )


def test_all_blocks_cleared_decodes_in_both_forms() -> None:
    batch = decode_batch(
        payload({"type": "AllBlocksCleared"}, ["AllBlocksCleared"], ["AllBlocksCleared", "CPU"])
    )
    assert batch.events == (AllBlocksCleared(None), AllBlocksCleared(None), AllBlocksCleared("CPU"))


def test_raw_digest_hashes_map_to_the_uint64_vllm_publishes() -> None:
    """With VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 vLLM sends the sha256 digests themselves."""
    captured = decode_sub_message(LIVE[0]).batch.events[0]
    assert isinstance(captured, BlockStored)
    first = hash_block(None, captured.token_ids[:32])
    second = hash_block(first.digest, captured.token_ids[32:64])
    batch = decode_batch(
        payload(stored(block_hashes=[second.digest], parent_block_hash=first.digest), removed(b"\x01" * 16))
    )
    event, eviction = batch.events
    assert isinstance(event, BlockStored) and isinstance(eviction, BlockRemoved)
    assert batch.rejected == ()
    assert event.block_hashes == captured.block_hashes[1:2]
    assert event.parent_block_hash == captured.block_hashes[0] == to_wire(first.digest)
    assert eviction.block_hashes == (int.from_bytes(b"\x01" * 8, "big"),)


@pytest.mark.parametrize("digest", [bytes(range(32)), bytes(range(16)), b"\xff" * 8, b"\x07"])
def test_hash_from_bytes_keeps_the_last_eight_bytes(digest: bytes) -> None:
    assert hash_from_bytes(digest) == int.from_bytes(digest, "big") & (2**64 - 1)


# --- malformed input --------------------------------------------------------------------------------

GOOD = LIVE[16][2]  # a real batch: six BlockRemoved and one BlockStored


@pytest.mark.parametrize(
    ("data", "reason_start"),
    [
        pytest.param(GOOD[:-5], "batch: not a msgpack value", id="truncated"),
        pytest.param(b"", "batch: not a msgpack value", id="empty"),
        pytest.param(b"\xc1", "batch: not a msgpack value", id="never-used-byte"),
        pytest.param(GOOD + b"\x00", "batch: not a msgpack value", id="trailing-bytes"),
        pytest.param(msgspec.msgpack.encode({"ts": 1.0, "events": []}), "batch: expected", id="map"),
        pytest.param(msgspec.msgpack.encode([1.0]), "batch: expected", id="no-events"),
        pytest.param(msgspec.msgpack.encode(["now", []]), "batch: expected", id="ts-not-a-number"),
        pytest.param(msgspec.msgpack.encode([1.0, {"a": 1}]), "batch: expected", id="events-not-a-list"),
        pytest.param(msgspec.msgpack.encode([1.0, [], -1]), "batch: expected", id="negative-rank"),
        pytest.param(msgspec.msgpack.encode([1.0, [], "0"]), "batch: expected", id="rank-a-string"),
        pytest.param(msgspec.msgpack.encode([1.0, [], 2**15]), "batch: expected", id="rank-past-smallint"),
        pytest.param(payload(*[removed(1)] * (2**15 + 1)), "batch: expected", id="more-events-than-numbers"),
    ],
)
def test_malformed_batch_raises_with_a_reason(data: bytes, reason_start: str) -> None:
    with pytest.raises(KVDecodeError) as raised:
        decode_batch(data)
    assert raised.value.reason.startswith(reason_start)


HASHES = "block_hashes: expected a list of uint64 (or digest bytes)"
PARENT = "parent_block_hash: expected a uint64, digest bytes or nil"


@pytest.mark.parametrize(
    ("bad_event", "reason"),
    [
        (stored(block_hashes=[1, "0xabc"]), f"BlockStored.{HASHES}"),
        (stored(block_hashes=[-5]), f"BlockStored.{HASHES}"),
        (stored(block_hashes=7), f"BlockStored.{HASHES}"),
        (stored(parent_block_hash="p"), f"BlockStored.{PARENT}"),
        (stored(token_ids=[1, "a"]), "BlockStored.token_ids: expected a list of int"),
        (stored(block_size=-1), "BlockStored.block_size: expected an int from 0 to 32767"),
        (stored(block_size=2**15), "BlockStored.block_size: expected an int from 0 to 32767"),
        (stored(medium=3), "BlockStored.medium: expected a string of up to 20 characters, or nil"),
        (stored(medium="G" * 21), "BlockStored.medium: expected a string of up to 20 characters, or nil"),
        (
            stored(lora_name="a" * 256),
            "BlockStored.lora_name: expected a string of up to 255 characters, or nil",
        ),
        (stored(group_idx=-1), "BlockStored.group_idx: expected an int from 0 to 32767, or nil"),
        (stored(extra_keys="salt"), "BlockStored.extra_keys: expected a list of arrays or nils, or nil"),
        ({k: v for k, v in stored().items() if k != "token_ids"}, "BlockStored.token_ids: missing"),
        ({**removed(1), "group_idx": "0"}, "BlockRemoved.group_idx: expected an int from 0 to 32767, or nil"),
        (
            {**removed(1), "group_idx": 2**15},
            "BlockRemoved.group_idx: expected an int from 0 to 32767, or nil",
        ),
        (["BlockStored", [1]], "BlockStored.parent_block_hash: missing"),
        (["BlockRemoved", ["x"], "GPU"], f"BlockRemoved.{HASHES}"),
        ({"type": "BlockMoved", "block_hashes": [1]}, "event: unknown type 'BlockMoved'"),
        (["BlockMoved", [1]], "event: unknown type 'BlockMoved'"),
        ({"block_hashes": [1]}, "event: no type name"),
        ([], "event: empty array"),
        (42, "event: expected a map or a tagged array, got int"),
    ],
)
def test_malformed_event_is_rejected_alone_with_a_reason_naming_the_field(
    bad_event: Any, reason: str
) -> None:
    batch = decode_batch(payload(removed(1), bad_event, stored()))
    assert [type(e).__name__ for e in batch.events] == ["BlockRemoved", "BlockStored"]
    assert [(r.index, r.reason) for r in batch.rejected] == [(1, reason)]


@pytest.mark.parametrize(
    ("bad_event", "code"),
    [
        (stored(block_hashes=[-5]), RejectReason.KV_FIELD_INVALID),
        (stored(kv_cache_spec_kind=7), RejectReason.KV_FIELD_INVALID),
        ({k: v for k, v in stored().items() if k != "token_ids"}, RejectReason.KV_FIELD_MISSING),
        ({"type": "BlockMoved"}, RejectReason.KV_UNKNOWN_TYPE),
        ({"block_hashes": [1]}, RejectReason.KV_EVENT_SHAPE),
        (42, RejectReason.KV_EVENT_SHAPE),
    ],
)
def test_a_rejected_event_carries_its_code_and_its_first_bytes(bad_event: Any, code: RejectReason) -> None:
    raw = msgspec.msgpack.encode(bad_event)
    [rejected] = decode_batch(payload(bad_event)).rejected
    assert (rejected.code, rejected.head) == (code, raw[:HEAD_BYTES])
    assert "head" not in repr(rejected)


def test_an_undecodable_batch_carries_its_code_and_at_most_its_first_64_bytes() -> None:
    data = payload(*[removed(1)] * 20)[:-1]
    with pytest.raises(KVDecodeError) as raised:
        decode_batch(data)
    assert (raised.value.code, raised.value.head) == (RejectReason.KV_NOT_MSGPACK, data[:64])
    assert raised.value.code in KV_DECODE_REASONS and data[:64].hex() not in str(raised.value)


def test_rejection_reasons_never_quote_token_ids() -> None:
    batch = decode_batch(payload(stored(token_ids=[123456789, "x"])))
    assert "123456789" not in batch.rejected[0].reason


@pytest.mark.parametrize(
    ("frames", "reason_start"),
    [
        pytest.param(LIVE[0][:2], "SUB message: expected 3 frames", id="two-frames"),
        pytest.param([*LIVE[0], b""], "SUB message: expected 3 frames", id="four-frames"),
        pytest.param([LIVE[0][0], b"\x00" * 4, LIVE[0][2]], "seq: expected 8 bytes", id="short-seq"),
        pytest.param([b"\xff\xfe", *LIVE[0][1:]], "topic: not UTF-8", id="topic-not-utf8"),
        pytest.param([*LIVE[0][:2], b"\x93"], "batch: not a msgpack value", id="bad-payload"),
    ],
)
def test_malformed_sub_message_raises(frames: list[bytes], reason_start: str) -> None:
    with pytest.raises(KVDecodeError) as raised:
        decode_sub_message(frames)
    assert raised.value.reason.startswith(reason_start)


@pytest.mark.parametrize(
    ("frames", "reason_start"),
    [
        pytest.param(REPLAY[0][2:], "replay reply: expected 3 or 4 frames", id="two-frames"),
        pytest.param([b"", *REPLAY[0]], "replay reply: expected 3 or 4 frames", id="five-frames"),
        pytest.param([b"x", *REPLAY[0][1:]], "replay reply: the first of four", id="no-delimiter"),
        pytest.param([b"", b"", b"\xff" * 7, b""], "seq: expected 8 bytes", id="short-end-marker"),
    ],
)
def test_malformed_replay_reply_raises(frames: list[bytes], reason_start: str) -> None:
    with pytest.raises(KVDecodeError) as raised:
        decode_replay_reply(frames)
    assert raised.value.reason.startswith(reason_start)


def test_batch_with_no_events_is_empty_not_an_error() -> None:
    assert decode_batch(payload()) == EventBatch(ts=1795988020.5, dp_rank=0, events=(), rejected=())


def test_the_offloading_connectors_cpu_events_decode_with_their_medium_and_group() -> None:
    """vLLM's OffloadingConnector publishes a placeholder BlockStored per CPU copy: one hash, no
    parent, no tokens, block_size 0, medium "CPU" (vllm/distributed/kv_transfer/kv_connector/v1/
    offloading/events.py, vLLM 0.32), plus fields Prefixscope does not keep (locality, ownership)."""
    placeholder = stored(token_ids=[], block_size=0, medium="CPU", group_idx=1, locality=None, ownership=None)
    without_size = {k: v for k, v in stored(medium="CPU").items() if k != "block_size"}
    cpu_removed = {**removed(2**64 - 1), "medium": "CPU", "group_idx": 1, "locality": None}
    batch = decode_batch(payload(placeholder, without_size, cpu_removed))
    assert not batch.rejected
    first, second, third = batch.events
    assert isinstance(first, BlockStored) and (first.medium, first.group_idx, first.block_size) == (
        "CPU",
        1,
        0,
    )
    assert isinstance(second, BlockStored) and second.block_size == 0
    assert isinstance(third, BlockRemoved) and (third.medium, third.group_idx) == ("CPU", 1)
