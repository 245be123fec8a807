"""KV events on the wire as vLLM publishes them: a ZMQ PUB socket and a ROUTER answering replays.

SUB messages are `[topic, seq (8 bytes, big-endian), payload]`; a replay request `["", start]`
is answered with `["", topic, seq, payload]` per buffered batch from `start` on, then
`["", "", ffffffffffffffff, ""]` (the layout of the real capture).
"""

import asyncio
import contextlib
import logging
import time

import zmq
import zmq.asyncio

from simulator.kv_events import KVEventData, ReplayBuffer, Sequencer, encode_batch, seq_frame

logger = logging.getLogger(__name__)

END_OF_REPLAY = (2**64 - 1).to_bytes(8, "big")


class KVPublisher:
    """Publishes batches of one engine's events and keeps them for replay."""

    def __init__(
        self,
        context: zmq.asyncio.Context,
        *,
        pub_endpoint: str,
        replay_endpoint: str,
        topic: str,
        array_form: bool = False,
        replay_capacity: int = 10_000,
    ) -> None:
        self.topic = topic.encode()
        self.array_form = array_form
        self.publisher = context.socket(zmq.PUB)
        self.router = context.socket(zmq.ROUTER)
        try:
            for socket, endpoint in ((self.publisher, pub_endpoint), (self.router, replay_endpoint)):
                socket.setsockopt(zmq.LINGER, 0)
                socket.bind(endpoint)
        except zmq.ZMQError:  # a port in use: let go of the other, so the context can end
            self.publisher.close()
            self.router.close()
            raise
        self.replay_capacity = replay_capacity
        self.restart()
        self._replay_task = asyncio.get_running_loop().create_task(self._serve_replays())

    def restart(self) -> None:
        """A new engine process: sequence numbers start again from 0 and the replay buffer is empty."""
        self.sequencer = Sequencer()
        self.buffer = ReplayBuffer(self.replay_capacity)

    async def publish(self, events: list[KVEventData], *, ts: float | None = None, dp_rank: int = 0) -> None:
        """Send one batch (nothing when there are no events)."""
        if not events:
            return
        payload = encode_batch(time.time() if ts is None else ts, events, dp_rank, array_form=self.array_form)
        seq = self.sequencer.next_seq()
        self.buffer.append(seq, payload)
        await self.publisher.send_multipart([self.topic, seq_frame(seq), payload])

    async def _serve_replays(self) -> None:
        while True:
            frames = await self.router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("malformed replay request with %d frames ignored", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in self.buffer.since(start):
                await self.router.send_multipart([identity, b"", self.topic, seq_frame(seq), payload])
            await self.router.send_multipart([identity, b"", b"", END_OF_REPLAY, b""])

    async def close(self) -> None:
        self._replay_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._replay_task
        self.publisher.close()
        self.router.close()
