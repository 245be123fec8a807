"""The gateway running in a background thread, and a recorder that keeps what it is given."""

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from collectors.errors import Rejection, RejectReason
from collectors.gateway.proxy import Recorder, serve
from collectors.records import RequestFacts
from tests.support.background import in_background, wait_listening
from tests.support.ports import unused_ports

# Fields that differ from call to call (a fresh id, the second of the answer), masked for comparing.
_PER_CALL = re.compile(rb'"(id|created)":\s*("[^"]*"|\d+)')


def masked(body: bytes) -> bytes:
    return _PER_CALL.sub(rb'"\1":"?"', body)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def call(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Answer:
    async def go() -> Answer:
        async with aiohttp.ClientSession() as session:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            async with session.request(method, url, data=data, headers=headers) as response:
                kept = sorted((k, v) for k, v in response.headers.items() if k != "Date")
                return Answer(response.status, kept, await response.read())

    return asyncio.run(go())


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Records are handed over just after the answer's last byte: wait for them a little."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class KeptRecords:
    """A recorder that keeps everything."""

    def __init__(self) -> None:
        self.records: list[RequestFacts] = []
        self.rejected: list[str] = []  # the details
        self.codes: list[RejectReason] = []

    def record(self, observed: RequestFacts) -> None:
        self.records.append(observed)

    def reject(self, why: Rejection) -> None:
        self.rejected.append(why.detail)
        self.codes.append(why.code)


@contextmanager
def running_gateway(upstream: str, recorder: Recorder, **options: Any) -> Iterator[str]:
    """Serve the gateway on a free local port until the block ends; yields its base URL. `options`:
    serve()'s keywords (starts_at_once, ...)."""
    (port,) = unused_ports(1)

    async def gateway(stop: asyncio.Event) -> None:
        await serve("127.0.0.1", port, upstream, recorder, stop, **options)

    with in_background(gateway):
        wait_listening("127.0.0.1", port)
        yield f"http://127.0.0.1:{port}"
