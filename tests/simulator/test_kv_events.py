"""The simulator's KV-event wire format is byte for byte what vLLM 0.32 published."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from simulator.kv_events import (
    REPLAY_END_SEQ,
    ReplayBuffer,
    Sequencer,
    all_blocks_cleared,
    block_removed,
    block_stored,
    encode_batch,
    seq_frame,
    to_array_form,
)
from tests.support.captures import load_json

LIVE = load_json("kv-live.decoded.json")
FRAMES = load_json("kv-live.msgpack-frames.json")


@pytest.mark.parametrize("index", range(len(LIVE)))
def test_a_captured_batch_encodes_to_the_captured_bytes(index: int) -> None:
    ts, events, dp_rank = LIVE[index]["batch"]
    assert encode_batch(ts, events, dp_rank) == bytes.fromhex(FRAMES[index]["payload_hex"])


def _first(kind: str) -> dict[str, Any]:
    return next(e for frame in LIVE for e in frame["batch"][1] if e["type"] == kind)


def test_event_builders_make_the_captured_maps_key_for_key() -> None:
    captured = _first("BlockStored")
    built = block_stored(
        block_hashes=captured["block_hashes"],
        parent_block_hash=captured["parent_block_hash"],
        token_ids=captured["token_ids"],
        block_size=captured["block_size"],
        lora_id=None,
        lora_name=None,
        extra_keys=captured["extra_keys"],
    )
    assert list(built.items()) == list(captured.items())
    removed = _first("BlockRemoved")
    assert list(block_removed(removed["block_hashes"][0]).items()) == list(removed.items())


def test_a_batch_without_a_rank_leaves_it_out() -> None:
    assert msgspec.msgpack.decode(encode_batch(1.0, [all_blocks_cleared()], None)) == [
        1.0,
        [{"type": "AllBlocksCleared"}],
    ]


def test_an_integer_timestamp_is_still_sent_as_a_float64() -> None:
    assert encode_batch(5, [], 0)[1:2] == b"\xcb"


def test_array_form_is_positional_in_declaration_order() -> None:
    stored = _first("BlockStored")
    decoded = msgspec.msgpack.decode(encode_batch(2.5, [stored, _first("BlockRemoved")], 0, array_form=True))
    ts, (stored_array, removed_array), rank = decoded
    assert (ts, rank) == (2.5, 0)
    assert stored_array == [
        "BlockStored",
        stored["block_hashes"],
        None,
        stored["token_ids"],
        32,
        None,
        "GPU",
        None,
        stored["extra_keys"],
        0,
        "full_attention",
    ]
    assert removed_array == ["BlockRemoved", _first("BlockRemoved")["block_hashes"], "GPU", 0]


def test_array_form_drops_only_trailing_defaults() -> None:
    old_style = {"type": "BlockRemoved", "block_hashes": [7], "medium": None}
    assert to_array_form(old_style) == ["BlockRemoved", [7], None]
    assert to_array_form(all_blocks_cleared()) == ["AllBlocksCleared"]
    with pytest.raises(ValueError, match="unknown KV event type"):
        to_array_form({"type": "BlockMoved"})


def test_sequencer_numbers_batches_from_zero() -> None:
    sequencer = Sequencer()
    assert [sequencer.next_seq() for _ in range(3)] == [0, 1, 2]


def test_sequence_frames_match_the_capture() -> None:
    assert [seq_frame(frame["seq"]).hex() for frame in FRAMES] == [f"{i:016x}" for i in range(len(FRAMES))]
    *_, (_, _, end_seq, end_payload) = load_json("kv-replay-from-0.frames.json")
    assert (REPLAY_END_SEQ.hex(), end_payload) == (end_seq, "")


def test_replay_buffer_answers_what_the_server_replayed() -> None:
    buffer = ReplayBuffer(capacity=10_000)
    for frame in FRAMES:
        buffer.append(frame["seq"], bytes.fromhex(frame["payload_hex"]))
    replayed = [
        (int(seq, 16), bytes.fromhex(payload))
        for _, _, seq, payload in load_json("kv-replay-from-0.frames.json")
        if bytes.fromhex(seq) != REPLAY_END_SEQ
    ]
    assert buffer.since(0) == replayed


def test_replay_buffer_forgets_the_oldest_and_answers_what_remains() -> None:
    buffer = ReplayBuffer(capacity=2)
    for seq in range(4):
        buffer.append(seq, bytes([seq]))
    assert len(buffer) == 2
    assert buffer.since(0) == [(2, b"\x02"), (3, b"\x03")]
    assert buffer.since(3) == [(3, b"\x03")]
    assert buffer.since(4) == []
    with pytest.raises(ValueError, match="at least one batch"):
        ReplayBuffer(capacity=0)
