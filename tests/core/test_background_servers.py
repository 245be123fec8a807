"""Servers the tests run in a background thread end with nothing left pending on their loop."""

import asyncio
import gc
import logging
import socket
import threading
from collections.abc import Callable

import pytest
from aiohttp import web

from tests.support.background import in_background, serving_app
from tests.support.processes import wait_until


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


def _hello_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/", _hello)
    return app


def test_a_connection_still_open_when_the_server_stops_leaves_no_task_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A loop that is only stopped keeps the idle connection's handler pending; when the collector
    # takes the loop, in whatever test runs then, asyncio logs "Task was destroyed but it is pending!"
    with serving_app(_hello_app()) as url:
        port = int(url.rsplit(":", 1)[1])
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        assert b"hello" in client.recv(4096)  # answered; the connection is kept alive, idle
    client.close()
    gc.collect()  # the server's loop is unreferenced now: collected, with what it held
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_server_that_fails_as_it_starts_raises_its_own_error_in_the_test() -> None:
    async def refuses(stop: asyncio.Event) -> None:
        raise OSError("address already in use")

    with pytest.raises(OSError, match="address already in use"), in_background(refuses):
        wait_until(_no_thread_named("refuses"), timeout=10, what="the server's thread to end")
        # its thread has ended, its loop closed: the block's end has nothing left to stop


def _no_thread_named(part: str) -> Callable[[], bool]:
    return lambda: not any(part in thread.name for thread in threading.enumerate())
