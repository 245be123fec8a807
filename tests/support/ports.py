"""Ports for test servers that nothing else will take between choosing one and binding it.

A port from `bind(("127.0.0.1", 0))` is an *ephemeral* port: once the probe closes it, the kernel
may hand it to any outgoing connection (to PostgreSQL, to Valkey, to another simulated server) before
the server under test binds it, and the server then fails "address already in use" (seen in CI: a
simulated server's replay socket lost its port to a connection). Ports below the ephemeral range are
never given to outgoing connections, and one counter walks them, so a test run never hands out the
same port twice. Under pytest-xdist each worker walks its own slice of that range, so two workers
never choose the same port between one's probe and its bind.
"""

import itertools
import os
import random
import socket
from pathlib import Path

LOWEST = 20_000


def _first_ephemeral_port() -> int:
    """The bottom of the kernel's ephemeral range (Linux's default is 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _own_slice(lowest: int, highest: int) -> range:
    """The ports this process may hand out: all of them, or its pytest-xdist worker's share."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    if not worker:
        return range(lowest, highest)
    count, index = int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), int(worker.removeprefix("gw"))
    width = (highest - lowest) // count
    return range(lowest + index * width, lowest + (index + 1) * width)


FIRST_EPHEMERAL = _first_ephemeral_port()
OWN_PORTS = _own_slice(LOWEST, FIRST_EPHEMERAL)
# Start where another test process (a second checkout's run) is unlikely to be walking.
_START = random.Random(os.getpid()).randrange(OWN_PORTS.start, OWN_PORTS.stop)
_candidates = itertools.cycle(itertools.chain(range(_START, OWN_PORTS.stop), range(OWN_PORTS.start, _START)))


def unused_ports(count: int) -> list[int]:
    """`count` different ports on 127.0.0.1 that nothing listens on now and no connection will get."""
    ports: list[int] = []
    while len(ports) < count:
        port = next(_candidates)
        if port not in ports and bindable(port):
            ports.append(port)
    return ports


def unused_port() -> int:
    """One port as `unused_ports` chooses them: free for a server, or closed for a refused connection."""
    return unused_ports(1)[0]


def bindable(port: int) -> bool:
    """Whether nothing holds `port` on 127.0.0.1 now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
