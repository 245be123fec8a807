"""How the end-to-end checks talk to a server under test, real or simulated: JSON over HTTP, /metrics
samples and the live KV events. Every helper takes URLs or sockets, never a particular server."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import zmq
from prometheus_client.parser import text_string_to_metric_families
from zmq.utils.monitor import recv_monitor_message

from collectors.kv_events.client import open_subscriber
from collectors.kv_events.parse import BlockStored, KVMessage, decode_sub_message

# The /metrics samples Prefixscope's collectors read.
COLLECTOR_SAMPLES = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:cache_config_info",
)
JOIN_TIMEOUT_SECONDS = 30.0
QUIET_SECONDS = 1.0


def post_json(
    url: str, body: Mapping[str, Any], timeout: float = 60.0, headers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """POST a JSON body and return the decoded JSON answer (an HTTP error raises)."""
    answer: dict[str, Any] = json.loads(post(url, body, timeout, headers))
    return answer


def post(
    url: str, body: Mapping[str, Any], timeout: float = 60.0, headers: Mapping[str, str] | None = None
) -> str:
    """POST a JSON body and return the answer's text (an HTTP error raises)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text: str = response.read().decode()
    return text


def get_text(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text: str = response.read().decode()
    return text


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus exposition text as sample name -> [(labels, value)]."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def total(text: str, name: str) -> float:
    """The sum of a sample over its label sets (one engine and one model here); 0 when absent."""
    return sum(value for _, value in samples(text).get(name, []))


def wait_for_counter(metrics_url: str, name: str, at_least: float, timeout: float = 10.0) -> str:
    """Scrape until counter ``name`` reaches ``at_least`` (stats trail responses); return the last text."""
    deadline = time.monotonic() + timeout
    text = get_text(metrics_url)
    while total(text, name) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
        text = get_text(metrics_url)
    return text


class Handshakes:
    """Socket monitors that count the handshakes of subscribers with their publishers: attached by
    passing this as `before_connect` (open_subscriber, KVEventCollector), since a monitor attached
    later may miss it. A subscriber has joined once its handshake is done: its subscription follows
    at once, and the publisher takes it in before it sends its next batch (libzmq processes a
    socket's pending commands as it sends, unless it did so within the last millisecond: the server
    is idle until the caller's first request). Batches published before the subscription arrives
    are lost (ZMQ's slow joiner), so a guessed wait would be a flake on a loaded machine."""

    def __init__(self) -> None:
        self._watched: list[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]] = []  # (subscriber, monitor)
        self.done = 0

    def __call__(self, subscriber: zmq.Socket[bytes]) -> None:
        self._watched.append((subscriber, subscriber.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)))

    def wait(
        self,
        at_least: int,
        *,
        keep_alive: Callable[[], object] = lambda: time.sleep(0.02),
        timeout: float = JOIN_TIMEOUT_SECONDS,
        what: str = "the subscription",
    ) -> None:
        """Until `at_least` handshakes in all are done, calling `keep_alive` (a collector's poll: a
        SUB socket that reconnected to a new publisher sends its subscription again only once its
        own thread uses it, libzmq's hiccup), once more after the last."""
        deadline = time.monotonic() + timeout
        while True:
            keep_alive()
            for _, monitor in self._watched:
                while monitor.poll(0):
                    self.done += recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if self.done >= at_least:
                keep_alive()
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: {self.done} of {at_least} handshakes within {timeout} s")

    def close(self) -> None:
        for subscriber, monitor in self._watched:
            if not subscriber.closed:
                subscriber.disable_monitor()
            monitor.close(linger=0)


def joined_subscriber(
    context: zmq.Context[zmq.Socket[bytes]], endpoint: str, topic: str, timeout: float = JOIN_TIMEOUT_SECONDS
) -> zmq.Socket[bytes]:
    """open_subscriber's socket, once it has joined the publisher at `endpoint` (Handshakes)."""
    handshakes = Handshakes()
    subscriber = open_subscriber(context, endpoint, topic, before_connect=handshakes)
    try:
        handshakes.wait(1, timeout=timeout, what=f"joining {endpoint}")
    except AssertionError:
        subscriber.close(linger=0)
        raise
    finally:
        handshakes.close()
    return subscriber


def drain(socket: zmq.Socket[bytes], quiet: float = QUIET_SECONDS, limit: float = 15.0) -> list[KVMessage]:
    """Receive SUB messages until none arrives for ``quiet`` seconds (or ``limit`` seconds pass)."""
    messages: list[KVMessage] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and socket.poll(timeout=round(quiet * 1000)):
        messages.append(decode_sub_message(socket.recv_multipart()))
    return messages


def stored_blocks(messages: Sequence[KVMessage]) -> Iterator[BlockStored]:
    for message in messages:
        for event in message.batch.events:
            if isinstance(event, BlockStored):
                yield event
