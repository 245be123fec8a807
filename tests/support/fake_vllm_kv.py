"""The KV-event side of a vLLM server, replaying the real capture over real ZMQ sockets.

No vLLM runs in these tests, so an XPUB publishes the captured payloads (their batch times moved to
now, where partitions exist) and a ROUTER answers replay requests in the captured reply layout
`["", topic, seq, payload]`, ended by `["", "", ffffffffffffffff, ""]`.
"""

import threading
import time
from typing import Any

import msgspec
import zmq

from tests.support.captures import load_json

END = (2**64 - 1).to_bytes(8, "big")


def captured_payloads(*, shift_to: float | None = None) -> list[tuple[int, bytes]]:
    """(seq, msgpack payload) of every captured batch, batch times moved so the first is `shift_to`."""
    messages = load_json("kv-live.msgpack-frames.json")
    payloads = [(m["seq"], bytes.fromhex(m["payload_hex"])) for m in messages]
    if shift_to is None:
        return payloads
    first_ts = msgspec.msgpack.decode(payloads[0][1])[0]
    return [(seq, retime(payload, shift_to - first_ts)) for seq, payload in payloads]


def retime(payload: bytes, by_seconds: float) -> bytes:
    batch: list[Any] = msgspec.msgpack.decode(payload)
    batch[0] += by_seconds
    return msgspec.msgpack.encode(batch)


class FakeKVServer:
    """Publishes batches like vLLM and keeps every one for replay."""

    def __init__(
        self, context: zmq.Context[zmq.Socket[bytes]], topic: str = "kv@127.0.0.1:18000@tiny"
    ) -> None:
        self.topic = topic.encode()
        self.publisher = context.socket(zmq.XPUB)
        self.publisher.setsockopt(zmq.LINGER, 0)
        self.pub_port = self.publisher.bind_to_random_port("tcp://127.0.0.1")
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: list[tuple[int, bytes]] = []
        # Seconds to wait before answering each coming replay request, in order (a busy server).
        self.replay_delays: list[float] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve_replays, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.pub_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def wait_for_subscriber(self, timeout_ms: int = 5000) -> None:
        assert self.publisher.poll(timeout_ms), "no subscriber arrived"
        self.publisher.recv()  # the subscription message

    def publish(self, seq: int, payload: bytes, *, send: bool = True) -> None:
        """Buffer a batch for replay and, unless `send` is False (lost on the way), publish it."""
        with self.lock:
            self.buffer.append((seq, payload))
        if send:
            self.publisher.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def restart(self) -> None:
        """A new vLLM process: its replay buffer starts empty."""
        with self.lock:
            self.buffer.clear()

    def _serve_replays(self) -> None:
        while not self.stopping.is_set():
            if not self.router.poll(20):
                continue
            identity, _, start = self.router.recv_multipart()
            if self.replay_delays:
                time.sleep(self.replay_delays.pop(0))
            with self.lock:
                replies = [(s, p) for s, p in self.buffer if s >= int.from_bytes(start, "big")]
            for seq, payload in replies:
                self.router.send_multipart([identity, b"", self.topic, seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([identity, b"", b"", END, b""])

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.publisher.close()
        self.router.close()
