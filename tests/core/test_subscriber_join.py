"""The end-to-end checks' KV event subscriber is handed over once it has joined its publisher."""

from collections.abc import Iterator

import pytest
import zmq

from collectors.kv_events.parse import decode_sub_message
from tests.support.kv_captures import TOPIC, live_frames
from tests.support.ports import unused_port
from tests.support.probes import joined_subscriber

Context = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def context() -> Iterator[Context]:
    context: Context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_the_subscriber_is_handed_over_once_its_subscription_is_on_its_way(context: Context) -> None:
    publisher = context.socket(zmq.XPUB)  # an XPUB, unlike vLLM's PUB, says when the subscription arrives
    port = publisher.bind_to_random_port("tcp://127.0.0.1")
    subscriber = joined_subscriber(context, f"tcp://127.0.0.1:{port}", TOPIC, timeout=10)
    assert publisher.poll(10_000), "the subscription never reached the publisher"
    assert publisher.recv() == b"\x01" + TOPIC.encode()
    first = live_frames()[0]
    publisher.send_multipart(first)
    assert subscriber.poll(10_000)
    assert decode_sub_message(subscriber.recv_multipart()) == decode_sub_message(first)


def test_a_publisher_that_is_not_there_fails_the_join_naming_it(context: Context) -> None:
    endpoint = f"tcp://127.0.0.1:{unused_port()}"
    with pytest.raises(AssertionError, match=f"joining {endpoint}: 0 of 1 handshakes within 0.3 s"):
        joined_subscriber(context, endpoint, TOPIC, timeout=0.3)
