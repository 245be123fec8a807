"""The ZMQ client against real sockets that replay the captured vLLM traffic.

No vLLM runs here, so an in-process XPUB publishes the captured SUB messages and a ROUTER answers
replay requests with the captured replies, as vLLM 0.32 did (frames byte for byte).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import zmq

from collectors.kv_events.client import ReplayUnavailable, SubscribeFailed, fetch_replay, open_subscriber
from collectors.kv_events.parse import decode_sub_message
from tests.support.kv_captures import TOPIC, live_frames, replay_frames
from tests.support.ports import unused_port

LIVE = live_frames()
REPLAY = replay_frames()  # ["", topic, seq, payload] each, end marker last
WAIT_MS = 5000  # generous: a wait only runs out when the behaviour under test is broken

Context = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def context() -> Iterator[Context]:
    ctx: Context = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def receive(sock: zmq.Socket[bytes]) -> list[bytes]:
    assert sock.poll(WAIT_MS), "nothing arrived"
    return sock.recv_multipart()


def _serve_replays(router: zmq.Socket[bytes], replies: list[list[bytes]], stop: threading.Event) -> None:
    """Answer like vLLM's replay service: every reply whose seq >= the requested one, in order."""
    while not stop.is_set():
        if not router.poll(20):
            continue
        identity, _delimiter, start = router.recv_multipart()
        for frames in replies:
            if int.from_bytes(frames[-2], "big") >= int.from_bytes(start, "big"):
                router.send_multipart([identity, *frames])


@contextmanager
def replay_server(context: Context, replies: list[list[bytes]]) -> Iterator[str]:
    """A ROUTER on a free local port answering replay requests with ``replies``; yields its endpoint."""
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()
    thread = threading.Thread(target=_serve_replays, args=(router, replies, stop), daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join()
        router.close()


def unserved_endpoint() -> str:
    return f"tcp://127.0.0.1:{unused_port()}"


def test_subscriber_receives_the_captured_stream_in_order_and_only_its_topic(context: Context) -> None:
    publisher = context.socket(zmq.XPUB)
    publisher.setsockopt(zmq.LINGER, 0)
    port = publisher.bind_to_random_port("tcp://127.0.0.1")
    subscriber = open_subscriber(context, f"tcp://127.0.0.1:{port}", TOPIC)
    try:
        # Messages published before the subscription reaches the publisher are dropped (slow joiner);
        # XPUB hands the subscription over, so publishing starts only once it has arrived.
        assert receive(publisher) == [b"\x01" + TOPIC.encode()]
        publisher.send_multipart([b"kv@10.0.0.9:8000@other", (99).to_bytes(8, "big"), LIVE[0][2]])
        for frames in LIVE:
            publisher.send_multipart(frames)
        received = [decode_sub_message(receive(subscriber)) for _ in LIVE]
        assert not subscriber.poll(100)
    finally:
        subscriber.close()
        publisher.close()
    assert [(m.topic, m.seq) for m in received] == [(TOPIC, seq) for seq in range(24)]
    assert [m.batch for m in received] == [decode_sub_message(f).batch for f in LIVE]


def test_fetch_replay_returns_every_buffered_batch_then_stops_at_the_end_marker(context: Context) -> None:
    with replay_server(context, REPLAY) as endpoint:
        replies = fetch_replay(context, endpoint, 0, timeout_seconds=5)
        later = fetch_replay(context, endpoint, 20, timeout_seconds=5)
        none_newer = fetch_replay(context, endpoint, 24, timeout_seconds=5)
    assert [r.seq for r in replies] == list(range(24))
    assert [r.batch for r in replies] == [decode_sub_message(f).batch for f in LIVE]
    assert {r.topic for r in replies} == {TOPIC}
    assert not any(r.end for r in replies)
    assert [r.seq for r in later] == [20, 21, 22, 23]
    assert none_newer == []


def test_a_replay_larger_than_zmqs_queues_arrives_whole(context: Context) -> None:
    """vLLM answers a replay from a ROUTER, which drops messages past its high-water mark (1,000)
    when the reader's queue is full: a reader decoding slower than the server sends once lost
    batches from the middle of the answer, or its end marker. 20,000 captured batches, renumbered."""
    batches = [frames for frames in REPLAY if int.from_bytes(frames[-2], "big") < len(LIVE)]
    many = [
        [*frames[:-2], seq.to_bytes(8, "big"), frames[-1]]
        for seq, frames in enumerate(itertools.islice(itertools.cycle(batches), 20_000))
    ]
    with replay_server(context, [*many, REPLAY[-1]]) as endpoint:
        replies = fetch_replay(context, endpoint, 0, timeout_seconds=60)
    assert [r.seq for r in replies] == list(range(20_000))


def test_replay_from_an_endpoint_nobody_serves_is_retryable_within_the_timeout(context: Context) -> None:
    started = time.monotonic()
    with pytest.raises(ReplayUnavailable) as raised:
        fetch_replay(context, unserved_endpoint(), 0, timeout_seconds=0.5)
    elapsed = time.monotonic() - started
    assert raised.value.retryable
    assert 0.5 <= elapsed < 0.5 + 2.0  # the timeout bounds the wait; 2 s of slack for a loaded machine


def test_replay_without_an_end_marker_times_out_retryable(context: Context) -> None:
    with replay_server(context, REPLAY[:-1]) as endpoint, pytest.raises(ReplayUnavailable) as raised:
        fetch_replay(context, endpoint, 0, timeout_seconds=0.5)
    assert raised.value.retryable
    assert "24 batches received" in raised.value.reason


def test_replay_reply_that_cannot_be_decoded_is_not_retryable(context: Context) -> None:
    garbage = [[b"", (0).to_bytes(8, "big"), b"\xc1"]]
    with replay_server(context, garbage) as endpoint, pytest.raises(ReplayUnavailable) as raised:
        fetch_replay(context, endpoint, 0, timeout_seconds=5)
    assert not raised.value.retryable
    assert "batch: not a msgpack value" in raised.value.reason


def test_endpoints_zmq_refuses_are_not_retryable(context: Context) -> None:
    with pytest.raises(ReplayUnavailable) as replay:
        fetch_replay(context, "nonsense", 0, timeout_seconds=5)
    with pytest.raises(SubscribeFailed) as subscribe:
        open_subscriber(context, "nonsense", TOPIC)
    assert (replay.value.retryable, subscribe.value.retryable) == (False, False)


@pytest.mark.parametrize("start_seq", [-1, 2**64 - 1])
def test_fetch_replay_refuses_a_start_seq_outside_uint64_before_the_end_marker(
    context: Context, start_seq: int
) -> None:
    with pytest.raises(ValueError, match="start_seq"):
        fetch_replay(context, unserved_endpoint(), start_seq, timeout_seconds=0.1)
