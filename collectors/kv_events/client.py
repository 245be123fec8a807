"""ZMQ I/O for vLLM KV events: open a subscriber, fetch a replay. Decoding lives in parse.

The ZMQ context, endpoints and timeouts come from the caller. Endpoints are the connect form
(``tcp://10.0.0.1:5557``), not vLLM's bind form (``tcp://*:5557``); with data parallelism each rank
has its own pair of ports (vllm-surface.md section 2.2).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from collectors.errors import CollectorError
from collectors.kv_events.parse import END_SEQ, KVDecodeError, ReplayReply, decode_replay_reply

logger = logging.getLogger(__name__)

DEFAULT_RCVHWM = 10_000
"""Batches a subscriber queues before ZMQ drops new ones; the same depth as vLLM's replay buffer
(``buffer_steps``), and a bound on memory (a batch of long prompts is tens of kilobytes)."""


class KVTransportError(CollectorError):
    """A ZMQ exchange with a KV event publisher failed; ``retryable`` says whether trying again can help."""


class SubscribeFailed(KVTransportError):
    """The subscriber socket could not be set up (an endpoint ZMQ refuses: not retryable)."""


class ReplayUnavailable(KVTransportError):
    """A replay could not be fetched: no complete answer in time (retryable), a bad endpoint or a
    reply that cannot be decoded (not retryable)."""


def open_subscriber(
    context: zmq.Context[zmq.Socket[bytes]],
    endpoint: str,
    topic: str,
    *,
    rcvhwm: int = DEFAULT_RCVHWM,
    before_connect: Callable[[zmq.Socket[bytes]], None] | None = None,
) -> zmq.Socket[bytes]:
    """A SUB socket connected to ``endpoint`` and subscribed to ``topic``; the caller owns and closes it.

    Read it with ``recv_multipart()`` and decode with ``parse.decode_sub_message``.
    Edge cases: ZMQ subscriptions match prefixes, so topic "kv@h:8000@m" also receives "kv@h:8000@m2"
    (compare ``KVMessage.topic``) and "" receives everything. Connecting is asynchronous: nobody
    listening is not an error, and batches published before the subscription reaches the publisher are
    lost (ZMQ's slow joiner), which shows up as a first seq above 0 or a gap to replay.
    Raises SubscribeFailed (not retryable) when ZMQ refuses the endpoint. ``before_connect`` is
    called with the socket before it connects: a socket monitor attached later may miss the handshake.
    """
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)  # closing must never wait for a dead publisher
    socket.setsockopt(zmq.RCVHWM, rcvhwm)  # only takes effect before connect
    socket.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
    if before_connect is not None:
        before_connect(socket)
    try:
        socket.connect(endpoint)
    except zmq.ZMQError as exc:
        socket.close(linger=0)
        raise SubscribeFailed(retryable=False, reason=f"cannot connect to {endpoint}: {exc}") from None
    return socket


QUIET_SECONDS = 1.0
"""An answer that stops this long before its end marker has lost its tail: ask again from there."""


def fetch_replay(
    context: zmq.Context[zmq.Socket[bytes]], endpoint: str, start_seq: int, *, timeout_seconds: float
) -> list[ReplayReply]:
    """Ask a replay endpoint for every buffered batch from ``start_seq`` on, in the publisher's order.

    Returns the replies before the end marker (each has a batch); an empty list when nothing that
    recent is buffered. vLLM silently starts later than ``start_seq`` when older batches have left its
    buffer: compare the first reply's seq. Raises ReplayUnavailable: retryable when the end marker has
    not arrived within ``timeout_seconds`` (nobody serves the endpoint, or the answer is slow),
    not retryable for an endpoint ZMQ refuses or a reply that cannot be decoded.

    vLLM answers from a ROUTER socket, which silently drops messages past its queue (1,000) when it
    sends faster than the connection takes them: batches from the middle of a long answer, or its
    end marker (seen on the simulator and in a test of 20,000 captured batches). So an answer with a
    hole, or one that falls quiet before its end, is asked again from the first seq missing, for as
    long as each round gets further; ``timeout_seconds`` covers every round.
    """
    if not 0 <= start_seq < END_SEQ:
        raise ValueError(f"start_seq must be a uint64 below {END_SEQ}, got {start_seq}")
    deadline = time.monotonic() + timeout_seconds
    replies: list[ReplayReply] = []
    asked = start_seq
    while True:
        answer, ended = _ask(context, endpoint, asked, deadline)
        if replies and answer and answer[0].seq != asked:
            break  # the hole has left the buffer since: what came in order is all there is
        kept = _up_to_the_first_hole(answer)
        replies += kept
        if ended and len(kept) == len(answer):
            break
        if not kept:
            raise ReplayUnavailable(
                retryable=True,
                reason=f"no end of replay from {endpoint} within {timeout_seconds}s "
                f"({len(replies)} batches received)",
            )
        asked = kept[-1].seq + 1
    logger.debug("replay from %s at seq %d: %d batches", endpoint, start_seq, len(replies))
    return replies


def _ask(
    context: zmq.Context[zmq.Socket[bytes]], endpoint: str, start_seq: int, deadline: float
) -> tuple[list[ReplayReply], bool]:
    """One replay request on a socket of its own (nothing late from an earlier round reaches it):
    the replies that came, and whether the end marker did."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    # Ours is read one decoded batch at a time: an unbounded queue lets ZMQ's I/O thread take the
    # answer as fast as it comes, so the ROUTER's queue drains (the answer is returned whole anyway).
    socket.setsockopt(zmq.RCVHWM, 0)  # only takes effect before connect
    try:
        try:
            socket.connect(endpoint)
        except zmq.ZMQError as exc:
            raise ReplayUnavailable(retryable=False, reason=f"cannot connect to {endpoint}: {exc}") from None
        # A DEALER's empty first frame stands for the delimiter a REQ socket would add.
        socket.send_multipart([b"", start_seq.to_bytes(8, "big")])
        return _read_until_end(socket, endpoint, deadline)
    finally:
        socket.close(linger=0)


def _read_until_end(
    socket: zmq.Socket[bytes], endpoint: str, deadline: float
) -> tuple[list[ReplayReply], bool]:
    """Collect replies until the end marker, the deadline, or a quiet second after the first reply."""
    replies: list[ReplayReply] = []
    while True:
        remaining = deadline - time.monotonic()
        wait = min(remaining, QUIET_SECONDS) if replies else remaining
        if wait <= 0 or not socket.poll(timeout=round(wait * 1000), flags=zmq.POLLIN):
            return replies, False
        try:
            reply = decode_replay_reply(socket.recv_multipart())
        except KVDecodeError as exc:
            raise ReplayUnavailable(
                retryable=False, reason=f"bad reply from {endpoint}: {exc.reason}"
            ) from None
        if reply.end:
            return replies, True
        replies.append(reply)


def _up_to_the_first_hole(answer: list[ReplayReply]) -> list[ReplayReply]:
    """The replies before the first seq that does not follow the one before it."""
    for index in range(1, len(answer)):
        if answer[index].seq != answer[index - 1].seq + 1:
            return answer[:index]
    return answer
