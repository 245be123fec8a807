"""How fast the captured vLLM KV event messages decode into dataclasses, against plain msgpack decoding.

Run from the repository root (so that ``collectors`` and ``tests`` import):
    .venv/bin/python -m bench kv_decode [repeats]

The baseline decodes the same payloads to plain Python objects with no validation and no dataclasses:
``msgpack.unpackb`` when the msgpack package is installed, else msgspec's untyped decoder (which does
the same job, faster). The target for the collector is 50,000 events/s decoded and stored on one core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bench.harness import best_seconds
from collectors.kv_events.parse import decode_sub_message
from tests.support.captures import load_json

ROUNDS = 5  # best of: the least disturbed run is the one that measures the code


def captured_frames() -> list[list[bytes]]:
    return [
        [m["topic"].encode(), m["seq"].to_bytes(8, "big"), bytes.fromhex(m["payload_hex"])]
        for m in load_json("kv-live.msgpack-frames.json")
    ]


def baseline() -> tuple[str, Callable[[bytes], Any]]:
    try:
        import msgpack  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        import msgspec

        return "msgspec.msgpack.decode (untyped; msgpack is not installed)", msgspec.msgpack.Decoder().decode
    return "msgpack.unpackb", lambda payload: msgpack.unpackb(payload, raw=False)


def main(argv: Sequence[str]) -> None:
    repeats = int(argv[0]) if argv else 2000
    frames = captured_frames()
    events = repeats * sum(len(decode_sub_message(f).batch.events) for f in frames)
    payloads = [f[2] for f in frames]
    name, plain_decode = baseline()

    def ours() -> None:
        for _ in range(repeats):
            for message in frames:
                decode_sub_message(message)

    def plain() -> None:
        for _ in range(repeats):
            for payload in payloads:
                plain_decode(payload)

    ours_rate = events / best_seconds(ours, ROUNDS)
    plain_rate = events / best_seconds(plain, ROUNDS)
    print(f"{len(frames)} captured messages x {repeats} = {events:,} events, best of {ROUNDS}")
    print(f"decode_sub_message: {ours_rate:12,.0f} events/s ({1e6 / ours_rate:.2f} us/event)")
    print(f"{name}: {plain_rate:12,.0f} events/s ({1e6 / plain_rate:.2f} us/event)")
    print(f"ratio decode_sub_message / baseline: {ours_rate / plain_rate:.2f}")
