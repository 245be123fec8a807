"""Requests per second through a simulated fleet of 4 servers over HTTP, per core of the fleet process.

    .venv/bin/python -m bench simulator_fleet [--requests 4000] [--concurrency 32]

The fleet runs in its own process (`python -m simulator.fleet --no-sleep`); this process sends
completions round-robin with aiohttp. Printed: wall-clock requests/s, requests per CPU-second of
the fleet process, and the ratio to a baseline measured in the same run: the same prompts through
PrefixCache alone, in this process (the cache work with no HTTP, JSON, metrics or events).
"""

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence

import aiohttp
import psutil

from simulator.cache import PrefixCache
from tests.support.ports import unused_ports

SERVERS = 4


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of about 400 tokens: one of 8 shared 320-token prefixes plus a unique tail."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50000) for _ in range(320)] for _ in range(8)]
    return [rng.choice(prefixes) + [rng.randrange(50000) for _ in range(80)] for _ in range(count)]


def baseline(batch: list[list[int]]) -> float:
    caches = [PrefixCache(32, 2048) for _ in range(SERVERS)]
    started = time.perf_counter()
    for number, prompt in enumerate(batch):
        cache = caches[number % SERVERS]
        cache.admit(str(number), prompt)
        cache.append_output(str(number), [1, 2, 3, 4])
        cache.finish(str(number))
        cache.take_events()
    return len(batch) / (time.perf_counter() - started)


async def drive(base_urls: list[str], batch: list[list[int]], concurrency: int) -> float:
    queue: asyncio.Queue[tuple[int, list[int]]] = asyncio.Queue()
    for item in enumerate(batch):
        queue.put_nowait(item)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            number, prompt = queue.get_nowait()
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 4}
            async with session.post(base_urls[number % SERVERS] + "/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()

    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return len(batch) / (time.perf_counter() - started)


def start_fleet() -> tuple[subprocess.Popen[str], list[str]]:
    # Server i takes base + i of each range: three bases side by side overlapped (address in use).
    ports = unused_ports(3 * SERVERS)  # consecutive but where one is taken
    http, kv, replay = ports[0], ports[SERVERS], ports[2 * SERVERS]
    args = ["--servers", str(SERVERS), "--base-port", str(http), "--kv-base-port", str(kv)]
    args += [
        "--replay-base-port",
        str(replay),
        "--no-sleep",
        "--num-blocks",
        "2048",
        "--max-model-len",
        "4096",
    ]
    fleet = subprocess.Popen(
        [sys.executable, "-m", "simulator.fleet", *args], stdout=subprocess.PIPE, text=True
    )
    assert fleet.stdout is not None
    urls = [json.loads(fleet.stdout.readline())["base_url"] for _ in range(SERVERS)]
    return fleet, urls


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    batch = prompts(args.requests)
    base = baseline(batch)
    fleet, urls = start_fleet()
    try:
        process = psutil.Process(fleet.pid)
        cpu_before = sum(process.cpu_times()[:2])
        wall = asyncio.run(drive(urls, batch, args.concurrency))
        cpu = sum(process.cpu_times()[:2]) - cpu_before
    finally:
        fleet.terminate()
        fleet.wait(10)
    per_core = args.requests / cpu
    print(f"fleet of {SERVERS} over HTTP: {wall:,.0f} requests/s wall clock")
    print(f"fleet process: {per_core:,.0f} requests per CPU-second")
    print(f"baseline (PrefixCache alone, same prompts): {base:,.0f} requests/s")
    print(f"ratio fleet per core / baseline: {per_core / base:.2f}  (target: >= 500 requests/s per core)")
