"""A fake vLLM KV-event publisher (replaying the real capture) for the KV collector's tests."""

from collections.abc import Iterator

import pytest
import zmq

from tests.support.fake_vllm_kv import FakeKVServer


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def vllm(context: zmq.Context[zmq.Socket[bytes]]) -> Iterator[FakeKVServer]:
    fake = FakeKVServer(context)
    yield fake
    fake.close()
