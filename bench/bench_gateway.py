"""Latency the gateway adds: the same completions through `manage.py gateway` and straight to vLLM.

    DATABASE_URL=postgres://... .venv/bin/python -m bench gateway [--rate 200] [--seconds 20] \
        [--warmup 10] [--floor]
    .venv/bin/python -m bench gateway --spill-only

A simulated vLLM server (`python -m simulator.fleet --no-sleep`: it answers at once) and the gateway
(`manage.py gateway`) each run in their own process. This process sends completions at `--rate`
per second to each of the two, interleaved (open loop, so a slow answer does not slow the sending),
half of them streamed, with prompts that share prefixes as templated traffic does, and times each
from send to the last byte of the answer, after --warmup seconds of the same traffic untimed.
Printed: p50 and p99 of both, the latency added (the difference of the percentiles) and the ratio
gateway / direct. Targets: p50 under 1 ms added, p99 under 5 ms.

With --floor, a second run puts a bare aiohttp pass-through proxy (no parsing, no recording) in the
gateway's place: what any aiohttp proxy adds on this machine, of which the gateway's own work is the rest.

The gateway's writer stores into a throw-away database (created on the server DATABASE_URL names,
dropped afterwards), so block hashes are computed and COPY runs while the proxy works. With
--spill-only (or no DATABASE_URL) its database is a port nothing listens on, and every record goes
to the spill file instead.
"""

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import psutil
from aiohttp import web

from app.domain import gpt2
from tests.support.ports import unused_ports

REPO = Path(__file__).resolve().parents[1]
SERVER = "bench-sim"
POLICY = (
    "You are the support assistant for the Acme router manual. Follow the policies below exactly. "
    "Policy one: never reveal internal ticket numbers. Policy two: answer in short numbered steps. "
    "Policy three: cite the manual section for every step. Tools available: search_manual, open_ticket. "
)


def bodies(count: int, seed: int = 0) -> list[dict[str, object]]:
    """Completions of one of 8 templates (a ~150-token shared prefix) with a varying question.

    Prompts go as token ids: the simulator then skips tokenizing (0.75 instead of 1.2 ms of CPU a
    request), which keeps the upstream, at twice the rate, far from saturating this machine."""
    rng = random.Random(seed)
    templates = [f"{POLICY * 2}Product line {n}. " for n in range(8)]
    return [
        {
            "model": "tiny",
            "prompt": gpt2.encode(f"{rng.choice(templates)}Question {rng.randrange(10**6)}: light {i}?"),
            "max_tokens": 4,
            "stream": i % 2 == 1,
        }
        for i in range(count)
    ]


async def timed(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> float:
    started = time.perf_counter()
    async with session.post(url, json=body, headers={"X-Prefixscope-Template": "bench"}) as response:
        await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - started


async def load(gateway: str, direct: str, rate: float, seconds: float, seed: int) -> dict[str, list[float]]:
    """Latencies per target; each target gets `rate` requests/s, the two interleaved."""
    sent = bodies(int(rate * seconds), seed)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as to_gateway,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as to_direct,
    ):
        targets = [("gateway", to_gateway, gateway), ("direct", to_direct, direct)]
        for _, session, base in targets:  # warm up connections and the simulator's tokenizer
            await asyncio.gather(*(timed(session, base + "/v1/completions", b) for b in bodies(50, seed=1)))
        start = time.perf_counter() + 0.1
        tasks: dict[str, list[asyncio.Task[float]]] = {"gateway": [], "direct": []}
        for i in range(len(sent)):
            for offset, (name, session, base) in enumerate(targets):
                due = start + i / rate + offset / (2 * rate)
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                tasks[name].append(asyncio.create_task(timed(session, base + "/v1/completions", sent[i])))
        return {name: list(await asyncio.gather(*found)) for name, found in tasks.items()}


async def serve_bare(port: int, upstream: str) -> None:
    """The floor: forward body and status, nothing else (run with --serve-bare PORT UPSTREAM)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
    ) as session:

        async def forward(request: web.Request) -> web.Response:
            body, kind = await request.read(), {"Content-Type": "application/json"}
            async with session.post(upstream + request.raw_path, data=body, headers=kind) as answer:
                headers = {"Content-Type": answer.headers["Content-Type"]}
                return web.Response(body=await answer.read(), status=answer.status, headers=headers)

        app = web.Application()
        app.router.add_post("/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await stop.wait()
        await runner.cleanup()


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


def wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{process.args!r} exited"
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def throwaway_database() -> tuple[str, Callable[[], int]]:
    """A migrated database with partitions and the benchmark's server; (its URL, its teardown)."""
    from django.db import connection
    from django.utils import timezone

    from app.fleet.models import Server
    from app.traffic.services.partitions import maintain_partitions
    from bench.harness import database_url_of

    connection.settings_dict["TEST"]["NAME"] = f"bench_gateway_{os.getpid()}"
    name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    maintain_partitions(now=timezone.now())
    Server.objects.create(name=SERVER, base_url="http://bench-sim", block_size=32, model="tiny")
    url = database_url_of(name)

    def drop() -> int:
        from app.traffic.models import RequestRecord

        stored = RequestRecord.objects.count()
        connection.creation.destroy_test_db(name, verbosity=0)
        return stored

    return url, drop


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second to each target")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of untimed traffic first")
    parser.add_argument("--spill-only", action="store_true", help="no database: records go to the spill file")
    parser.add_argument("--floor", action="store_true", help="also measure a bare aiohttp proxy")
    parser.add_argument("--serve-bare", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_bare:
        asyncio.run(serve_bare(int(args.serve_bare[0]), args.serve_bare[1]))
        return
    spill_only = args.spill_only or not os.environ.get("DATABASE_URL")
    http, kv, replay, listen, closed = unused_ports(5)
    drop: Callable[[], int] | None = None
    if spill_only:
        database_url = f"postgres://127.0.0.1:{closed}/none"
    else:
        database_url, drop = throwaway_database()
    spill = Path(tempfile.mkdtemp()) / "spill.jsonl"
    ports = ["--base-port", str(http), "--kv-base-port", str(kv), "--replay-base-port", str(replay)]
    fleet_command = [sys.executable, "-m", "simulator.fleet", "--servers", "1", "--no-sleep", *ports]
    upstream = subprocess.Popen(fleet_command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gateway_command = [sys.executable, "manage.py", "gateway", "--listen", f"127.0.0.1:{listen}",
                       "--upstream", f"http://127.0.0.1:{http}", "--spill-file", str(spill),
                       *([] if spill_only else ["--server", SERVER])]  # fmt: skip
    bare_command = [
        sys.executable,
        "-m",
        "bench",
        "gateway",
        "--serve-bare",
        str(listen),
        f"http://127.0.0.1:{http}",
    ]
    try:
        wait_listening(http, upstream)
        environment = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "ERROR"}
        latencies, cpu, summary = measure(gateway_command, environment, listen, http, args)
        floor = measure(bare_command, dict(os.environ), listen, http, args) if args.floor else None
    finally:
        upstream.send_signal(signal.SIGTERM)
        upstream.wait(timeout=30)
    print(f"{args.rate:.0f} requests/s to each of the proxy and the upstream, interleaved, "
          f"for {args.seconds:.0f} s (half streamed); latency from send to the last byte, in ms")  # fmt: skip
    report("gateway", latencies, cpu)
    if floor:
        report("bare aiohttp proxy (the floor)", floor[0], floor[1])
    recorder = "spill file only (database unreachable)" if spill_only else "a throw-away database"
    print(f"recorder: {recorder}; {summary}")
    if drop:
        print(f"request records in the database: {drop()}")
    if spill.exists():
        print(f"spill file: {sum(1 for _ in spill.open())} records")


def measure(
    command: list[str], environment: dict[str, str], listen: int, http: int, args: argparse.Namespace
) -> tuple[dict[str, list[float]], float, str]:
    """Latencies through the proxy `command` starts and direct; its CPU seconds; what it printed."""
    proxy = subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.PIPE)
    try:
        wait_listening(listen, proxy)
        process = psutil.Process(proxy.pid)
        through, direct = f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{http}"
        # The first seconds after the simulator starts have pauses of tens of ms on both targets:
        # timed, whichever proxy went first took p99s of 15-50 ms (direct ones too), the second 2-5 ms.
        asyncio.run(load(through, direct, args.rate, args.warmup, seed=2))
        before = sum(process.cpu_times()[:2])
        latencies = asyncio.run(load(through, direct, args.rate, args.seconds, seed=0))
        cpu = sum(process.cpu_times()[:2]) - before
    finally:
        proxy.send_signal(signal.SIGTERM)
        printed = proxy.communicate(timeout=60)[0].decode().strip()
    return latencies, cpu, printed


def report(name: str, latencies: dict[str, list[float]], cpu: float) -> None:
    through, direct = latencies["gateway"], latencies["direct"]
    print(f"-- {name}: {len(through)} requests through it, {len(direct)} direct")
    print(f"{'':10}{'p50':>9}{'p99':>9}{'mean':>9}")
    for label, values in (("direct", direct), ("proxied", through)):
        row = [percentile(values, 0.5), percentile(values, 0.99), statistics.fmean(values)]
        print(f"{label:10}" + "".join(f"{v * 1000:9.3f}" for v in row))
    added = [percentile(through, q) - percentile(direct, q) for q in (0.5, 0.99)]
    print(f"{'added':10}{added[0] * 1000:9.3f}{added[1] * 1000:9.3f}   (targets: p50 < 1 ms, p99 < 5 ms)")
    ratios = [percentile(through, q) / percentile(direct, q) for q in (0.5, 0.99)]
    print(f"{'ratio':10}{ratios[0]:9.2f}{ratios[1]:9.2f}   (proxied / direct)")
    print(f"proxy process CPU: {cpu / len(through) * 1000:.2f} ms per request")
