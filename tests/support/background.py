"""Asyncio servers run in a background thread, for tests that talk to them over real sockets."""

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from tests.support.ports import unused_ports

Main = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


def wait_listening(host: str, port: int, timeout: float = 10.0) -> None:
    """Wait until `port` accepts connections; a loaded machine can take a while to bind."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        assert time.monotonic() < deadline, f"nothing listens on {host}:{port}"
        time.sleep(0.02)


@contextmanager
def in_background(main: Main) -> Iterator[None]:
    """Run `main(stop)` on an event loop of its own in a thread until the block ends, then set
    `stop` and wait for `main` to return.

    The loop ends as asyncio.run ends one: the tasks `main` left (a server's handler of a
    connection its peer just closed) are cancelled and waited for before the loop closes. A loop
    merely stopped keeps them pending, and when the garbage collector later takes it, in whichever
    test is running then, asyncio logs "Task was destroyed but it is pending!" into that test (a
    CI failure of a test that checks its log has no error).
    """
    runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)  # the test thread's loop is left be
    stop = asyncio.Event()
    failed: list[BaseException] = []

    def run() -> None:
        with runner:
            try:
                runner.run(main(stop))
            except BaseException as exc:  # noqa: BLE001 (raised by the block, in the test's thread)
                failed.append(exc)

    loop = runner.get_loop()
    thread = threading.Thread(target=run, name=f"in_background({main.__qualname__})", daemon=True)
    thread.start()
    try:
        yield
    finally:
        # A `main` that failed early has returned and its loop is closed: nothing to stop, and its
        # error, raised below, is what the test should see, not the closed loop's.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        assert not thread.is_alive(), f"{main.__qualname__} did not stop within 10 s"
        if failed:
            raise failed[0]


@contextmanager
def serving_app(app: web.Application) -> Iterator[str]:
    """Serve `app` on a free local port until the block ends; yields its base URL once it listens."""
    (port,) = unused_ports(1)
    started = threading.Event()

    async def serve(stop: asyncio.Event) -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            try:
                await web.TCPSite(runner, "127.0.0.1", port).start()
            finally:
                started.set()  # listening, or failed (then the block's end raises why)
            await stop.wait()
        finally:
            await runner.cleanup()

    with in_background(serve):
        assert started.wait(10), f"the server on port {port} did not start within 10 s"
        yield f"http://127.0.0.1:{port}"
