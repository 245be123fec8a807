"""A simulated fleet running in a background thread, for tests that talk to it over real sockets."""

import asyncio
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import httpx
import zmq

from collectors.kv_events.client import open_subscriber
from collectors.kv_events.parse import decode_sub_message
from simulator.fleet import serve
from simulator.server import ServerConfig
from tests.support.background import in_background, wait_listening
from tests.support.ports import unused_ports


def local_config(**fields: object) -> ServerConfig:
    """A fast (no sleeping) server on free ports; `fields` override the rest."""
    http, kv, replay = unused_ports(3)
    config = ServerConfig(http_port=http, kv_port=kv, replay_port=replay, sleep=False)
    return replace(config, **fields)  # type: ignore[arg-type]


@contextmanager
def running_fleet(configs: list[ServerConfig]) -> Iterator[list[ServerConfig]]:
    """Serve `configs` until the block ends; every server accepts connections when the block starts."""

    async def fleet(stop: asyncio.Event) -> None:
        await serve(configs, stop)

    with in_background(fleet):
        for config in configs:
            wait_listening(config.host, config.http_port)
        yield configs


def joined_subscriber(
    context: zmq.Context[zmq.Socket[bytes]], config: ServerConfig
) -> tuple[zmq.Socket[bytes], int]:
    """A SUB socket on the KV events of `config`'s server, fresh (no request served yet), once it
    has joined the publisher; and the seq of the last batch before the caller's.

    ZMQ's slow joiner drops what is published before the subscription reaches the publisher, which
    on a loaded machine can outlast several requests: rather than wait a guessed time, one-token
    requests of a prompt of their own are sent until a batch arrives. Each is one batch, request n
    of a fresh server is seq n, so the socket is read up to the last one sent: later batches are
    the caller's.
    """
    subscriber = open_subscriber(context, f"tcp://127.0.0.1:{config.kv_port}", config.topic)
    deadline = time.monotonic() + 20
    for last in itertools.count():
        prompt = f"Warm-up {last}: is anyone listening? " * 4
        body = {"model": config.model, "prompt": prompt, "max_tokens": 1}
        httpx.post(f"{config.base_url}/v1/completions", json=body, timeout=10).raise_for_status()
        if subscriber.poll(100):
            while decode_sub_message(subscriber.recv_multipart()).seq < last:
                assert subscriber.poll(10_000), f"batch {last} of {config.name} never arrived"
            return subscriber, last
        assert time.monotonic() < deadline, f"the subscriber never joined {config.name}'s publisher"
    raise AssertionError("unreachable")
