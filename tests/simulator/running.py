"""A simulated fleet running in a background thread, for tests that talk to it over real sockets."""

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from simulator.fleet import serve
from simulator.server import ServerConfig


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_config(**fields: object) -> ServerConfig:
    """A fast (no sleeping) server on free ports; `fields` override the rest."""
    http, kv, replay = free_ports(3)
    config = ServerConfig(http_port=http, kv_port=kv, replay_port=replay, sleep=False)
    return replace(config, **fields)  # type: ignore[arg-type]


@contextmanager
def running_fleet(configs: list[ServerConfig]) -> Iterator[list[ServerConfig]]:
    """Serve `configs` until the block ends."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()

    async def main() -> None:
        task = asyncio.ensure_future(serve(configs, stop))
        await asyncio.sleep(0.2)
        started.set()
        await task

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10), "the fleet did not start"
    try:
        yield configs
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
