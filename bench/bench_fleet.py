"""KV events a simulated fleet publishes, stored by one and by several `collect_kv_events` processes.

    DATABASE_URL=postgres://... .venv/bin/python -m bench.bench_fleet [--servers 20] [--subscribers 2]
        [--seconds 30] [--concurrency 32]

Runs in a throw-away database on the server DATABASE_URL names. A fleet of simulated servers
(`python -m simulator.fleet --no-sleep`, its own process) answers completions sent round-robin from
this process for `--seconds`, and its KV events are collected, first by one subscriber process
(the baseline), then, on a fresh fleet, by `--subscribers` processes sharing the servers through
their leases. Printed per subscriber process: the servers it leased, the events (block rows) it
stored per second while the load ran, its CPU per 1,000 events, and how long after the load the
whole fleet's events were stored (what it had not kept up with). A skeleton for the 100-server
figures: the simulator fleet is one process, and on a small machine it is the bottleneck.
"""

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "app.settings")

import django

django.setup()

import aiohttp  # noqa: E402
import psutil  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.utils import timezone  # noqa: E402

from app.fleet.models import Server  # noqa: E402
from app.fleet.services import register_server  # noqa: E402
from app.traffic.kv_leases import lease_holders  # noqa: E402
from app.traffic.models import KVEvent  # noqa: E402
from app.traffic.services.partitions import maintain_partitions  # noqa: E402
from tests.simulator.running import free_ports  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LEASE_SECONDS = 2


def start_fleet(count: int) -> tuple[subprocess.Popen[str], list[dict[str, str]]]:
    http, kv, replay = (port - port % 1000 for port in free_ports(3))  # room for `count` ports each
    args = ["--servers", str(count), "--base-port", str(http), "--kv-base-port", str(kv + 200)]
    args += [
        "--replay-base-port",
        str(replay + 400),
        "--no-sleep",
        "--num-blocks",
        "256",
        "--max-model-len",
        "4096",
    ]
    fleet = subprocess.Popen(
        [sys.executable, "-m", "simulator.fleet", *args], stdout=subprocess.PIPE, text=True
    )
    assert fleet.stdout is not None
    return fleet, [json.loads(fleet.stdout.readline()) for _ in range(count)]


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    """About 720 tokens: one of 8 shared 320-token prefixes and a unique 400-token tail, so that each
    completion stores a dozen blocks and, the cache full, evicts as many (the events a busy server sends)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50000) for _ in range(320)] for _ in range(8)]
    return [rng.choice(prefixes) + [rng.randrange(50000) for _ in range(400)] for _ in range(count)]


async def drive(base_urls: list[str], seconds: float, concurrency: int) -> int:
    """Completions round-robin over the fleet for `seconds`; returns how many were answered."""
    batch, sent, answered = prompts(5000), 0, 0
    deadline = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent, answered
        while time.monotonic() < deadline:
            number, sent = sent, sent + 1
            body = {"model": "tiny", "prompt": batch[number % len(batch)], "max_tokens": 4}
            async with session.post(
                base_urls[number % len(base_urls)] + "/v1/completions", json=body
            ) as answer:
                await answer.read()
                answered += answer.status == 200

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return answered


def start_subscribers(count: int, database_url: str, folder: Path) -> list[subprocess.Popen[bytes]]:
    environment = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING"}
    command = [sys.executable, "manage.py", "collect_kv_events", "--rescan-seconds", str(LEASE_SECONDS)]
    return [
        subprocess.Popen(
            command,
            cwd=REPO,
            env=environment,
            stdout=(folder / f"kv-{i}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for i in range(count)
    ]


def wait_for(condition: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError
        time.sleep(0.2)
    return time.monotonic() - started


def stored_rows(server_ids: list[int]) -> int:
    return KVEvent.objects.filter(server_id__in=server_ids).count()


def run(servers: int, subscribers: int, seconds: float, concurrency: int, database_url: str) -> None:
    fleet, described = start_fleet(servers)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        ids = [register_server(**{k: str(v) for k, v in d.items()}).pk for d in described]
        processes = start_subscribers(subscribers, database_url, Path(tempfile.mkdtemp()))
        wait_for(lambda: _shared(servers, subscribers), timeout=60 + 4 * LEASE_SECONDS * subscribers)
        holders = lease_holders()
        owned = {p.pid: [pk for pk, name in holders.items() if name.endswith(f":{p.pid}")] for p in processes}
        rows_before = {pid: stored_rows(pks) for pid, pks in owned.items()}
        cpu_before = {p.pid: sum(psutil.Process(p.pid).cpu_times()[:2]) for p in processes}
        answered = asyncio.run(drive([d["base_url"] for d in described], seconds, concurrency))
        rows_during = {pid: stored_rows(pks) - rows_before[pid] for pid, pks in owned.items()}
        settled = max(0.0, wait_for(_caught_up(ids), timeout=120) - 1.0)
        cpu = {p.pid: sum(psutil.Process(p.pid).cpu_times()[:2]) - cpu_before[p.pid] for p in processes}
        rows = {pid: stored_rows(pks) - rows_before[pid] for pid, pks in owned.items()}
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)
        fleet.terminate()
        fleet.wait(10)
    print(f"{servers} servers, {subscribers} subscriber(s): {answered / seconds:,.0f} completions/s "
          f"for {seconds:.0f} s, all events stored {settled:.1f} s after the load")  # fmt: skip
    for pid, pks in owned.items():
        per_thousand = 1000 * cpu[pid] / rows[pid] if rows[pid] else float("nan")
        print(f"  process {pid}: {len(pks)} servers, {rows_during[pid] / seconds:,.0f} events/s stored "
              f"during the load, {per_thousand * 1000:.0f} ms CPU per 1,000 events")  # fmt: skip
    Server.objects.all().delete()


def _shared(servers: int, subscribers: int) -> bool:
    """Every server leased, by every subscriber process."""
    holders = lease_holders()
    return len(holders) == servers and len(set(holders.values())) == subscribers


def _caught_up(ids: list[int]) -> Callable[[], bool]:
    """A condition true once no event was stored for a second (the subscribers caught up)."""
    last = [-1]

    def quiet() -> bool:
        stored = stored_rows(ids)
        if stored == last[0]:
            return True
        last[0] = stored
        time.sleep(1.0)
        return False

    return quiet


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--subscribers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    setup_test_environment()
    test_database = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    database_url = urlunsplit(urlsplit(os.environ["DATABASE_URL"])._replace(path=f"/{test_database}"))
    try:
        maintain_partitions(now=timezone.now())
        run(args.servers, 1, args.seconds, args.concurrency, database_url)  # the baseline
        run(args.servers, args.subscribers, args.seconds, args.concurrency, database_url)
    finally:
        connection.creation.destroy_test_db(test_database, verbosity=0)


if __name__ == "__main__":
    main()
