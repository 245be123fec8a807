"""Servers the tests run in a background thread end with nothing left pending on their loop."""

import gc
import logging
import socket

import pytest
from aiohttp import web

from tests.support.background import serving_app


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
