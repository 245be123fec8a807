"""A simulated fleet's KV events and completions, collected and diagnosed by Prefixscope's processes.

    DATABASE_URL=postgres://... .venv/bin/python -m bench fleet [--servers 100] [--fleets 4]
        [--subscribers 2] [--gateways 2] [--seconds 20] [--concurrency 32] [--rate 0] [--diagnosis-delay 5]

Runs in a throw-away database on the server DATABASE_URL names (PostgreSQL's default max_connections,
100, is enough: a gateway writes on its pool of PREFIXSCOPE_GATEWAY_CONNECTIONS, however many servers it
fronts). `--fleets` simulator processes
(`python -m simulator.fleet --no-sleep`) serve `--servers` simulated servers between them; this
process sends completions round-robin over the servers for `--seconds` (`--rate` a second, or as
fast as `--concurrency` of them come back), through `manage.py gateway`
processes (each fronting a share of the servers: they store the request records), while
`collect_kv_events` processes store the KV events (sharing the servers through their leases) and a
diagnosis process diagnoses each compatibility group in turn, as the per-group Celery tasks do,
every `--diagnosis-delay` seconds with PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS at that value.
First with one subscriber and one gateway (the baseline), then on a fresh fleet with
`--subscribers` and `--gateways`. Printed per collector process: the servers it serves, the events
or requests it stored per second while the load ran, its CPU per 1,000 of them; then the lag at
p50/p99 from a KV event's emission (vLLM's batch timestamp) to its storage (the first poll, every
POLL_SECONDS, of the stream positions stored with it that covers it), and from a completion's
answer (arrival plus the client's TTFT) to the end of the diagnosis run that diagnosed it.
"""

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import psutil
from django.db import connection
from django.utils import timezone

from app.diagnosis.run import compatibility_groups, diagnose_requests
from app.fleet.models import Server
from app.fleet.services import register_server
from app.traffic.collection.kv_leases import lease_holders
from app.traffic.models import KVEvent, KVStream, RequestDiagnosis, RequestRecord
from app.traffic.tasks import scrape_server
from bench.harness import database_url_of, throwaway_database

REPO = Path(__file__).resolve().parents[1]
LEASE_SECONDS = 2
POLL_SECONDS = 0.25
WARM_UP_SECONDS = 3.0


def free_base(span: int) -> int:
    """A port p such that p .. p + span are free now, below Linux's ephemeral ports (32768 up), which
    the fleet's own connections would otherwise take from under a server about to listen."""
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(10_000, 32_000 - span)
        if all(_free(base + i) for i in range(span)):
            return base
    raise RuntimeError("no free range of ports")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start_fleets(servers: int, fleets: int) -> tuple[list[subprocess.Popen[str]], list[dict[str, str]]]:
    """`fleets` simulator processes serving `servers` between them; the servers, renamed apart."""
    shares = [len(part) for part in np.array_split(range(servers), fleets)]
    base = free_base(3 * servers + 10)
    processes, described = [], []
    for number, count in enumerate(shares):
        first = base + sum(shares[:number])
        ports = [str(first), str(first + servers), str(first + 2 * servers)]
        args = ["--servers", str(count), "--base-port", ports[0], "--kv-base-port", ports[1]]
        args += [
            "--replay-base-port",
            ports[2],
            "--no-sleep",
            "--num-blocks",
            "256",
            "--max-model-len",
            "4096",
        ]
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "simulator.fleet", *args], stdout=subprocess.PIPE, text=True
            )
        )
    for number, (process, count) in enumerate(zip(processes, shares, strict=True)):
        assert process.stdout is not None
        for _ in range(count):
            server = json.loads(process.stdout.readline())
            described.append({**server, "name": f"f{number}-{server['name']}"})
    return processes, described


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    """About 720 tokens: one of 8 shared 320-token prefixes and a unique 400-token tail, so that each
    completion stores a dozen blocks and, the cache full, evicts as many (the events a busy server sends)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50000) for _ in range(320)] for _ in range(8)]
    return [rng.choice(prefixes) + [rng.randrange(50000) for _ in range(400)] for _ in range(count)]


async def drive(base_urls: list[str], seconds: float, concurrency: int, rate: float) -> int:
    """Completions round-robin over `base_urls` for `seconds`, `rate` a second when > 0 (the i-th
    sent at i / rate: the same load for every run, whatever the machine does meanwhile), else as
    fast as `concurrency` answers come back; returns how many were answered."""
    batch, sent, answered = prompts(5000), 0, 0
    start = time.monotonic()

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent, answered
        while time.monotonic() < start + seconds:
            number, sent = sent, sent + 1
            if rate > 0:
                await asyncio.sleep(start + number / rate - time.monotonic())
            body = {"model": "tiny", "prompt": batch[number % len(batch)], "max_tokens": 4}
            url = base_urls[number % len(base_urls)] + "/v1/completions"
            async with session.post(url, json=body) as answer:
                await answer.read()
                answered += answer.status == 200

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return answered


def manage(args: list[str], database_url: str, log: Path, **environment: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING", **environment},
        )  # fmt: skip


def start_gateways(
    count: int, described: list[dict[str, str]], database_url: str, folder: Path
) -> tuple[list[str], dict[subprocess.Popen[bytes], list[int]]]:
    """`count` gateway processes, each fronting a share of the servers: the URL fronting each
    server, and {process: its servers' indexes}."""
    base, shares = free_base(len(described) + 1), {}
    for number, share in enumerate(np.array_split(np.arange(len(described)), count)):
        args = ["manage.py", "gateway"]
        for i in share:
            args += ["--listen", f"127.0.0.1:{base + i}", "--upstream", described[i]["base_url"]]
            args += ["--server", described[i]["name"]]
        shares[manage(args, database_url, folder / f"gateway-{number}.log")] = [int(i) for i in share]
    return [f"http://127.0.0.1:{base + i}" for i in range(len(described))], shares


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as sock:
        return sock.connect_ex((parts.hostname or "", parts.port or 0)) == 0


def wait_for(condition: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError
        time.sleep(0.2)
    return time.monotonic() - started


@contextmanager
def stream_positions() -> Iterator[list[tuple[float, int, int, int, int]]]:
    """Polls the stored stream positions every POLL_SECONDS, in a thread, while the block runs:
    (time, server, rank, epoch, last seq) rows, a position once it changed."""
    found: list[tuple[float, int, int, int, int]] = []
    stop = threading.Event()

    def poll() -> None:
        last: dict[tuple[int, int], tuple[int, int]] = {}
        while not stop.wait(POLL_SECONDS):
            rows = KVStream.objects.values_list("server_id", "dp_rank", "epoch", "last_seq")
            now = time.time()
            for server, rank, epoch, seq in rows:
                if last.get((server, rank)) != (epoch, seq):
                    last[(server, rank)] = (epoch, seq)
                    found.append((now, server, rank, epoch, seq))
        connection.close()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        stop.set()
        thread.join()


def event_lags(positions: list[tuple[float, int, int, int, int]]) -> list[float]:
    """Seconds from each batch's emission to the first poll whose stored position covers it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT server_id, dp_rank, epoch, seq, min(emitted_at) FROM traffic_kvevent GROUP BY 1, 2, 3, 4"
        )
        batches = cursor.fetchall()
    polls: dict[tuple[int, int, int], tuple[list[int], list[float]]] = {}
    for at, server, rank, epoch, seq in positions:
        seqs, times = polls.setdefault((server, rank, epoch), ([], []))
        seqs.append(seq)
        times.append(at)
    lags = []
    for server, rank, epoch, seq, emitted in batches:
        seqs, times = polls.get((server, rank, epoch), ([], []))
        index = int(np.searchsorted(seqs, seq))  # positions only grow: the first one at or past it
        if index < len(seqs):
            lags.append(times[index] - emitted.timestamp())
    return lags


def request_lags(runs: dict[str, float]) -> list[float]:
    """Seconds from each completion's answer to the end of the run that diagnosed it."""
    rows = RequestDiagnosis.objects.values_list("server_id", "request_id", "arrived_at", "diagnosed_at")
    diagnosed = {(s, r, a): runs.get(at.isoformat()) for s, r, a, at in rows}
    records = RequestRecord.objects.values_list(
        "server_id", "request_id", "arrived_at", "client_ttft_seconds"
    )
    return [
        done - (arrived.timestamp() + (ttft or 0.0))
        for server, request, arrived, ttft in records
        if (done := diagnosed.get((server, request, arrived))) is not None
    ]


def cpu_seconds(process: subprocess.Popen[Any]) -> float:
    return sum(psutil.Process(process.pid).cpu_times()[:2])


def percentiles(values: list[float]) -> str:
    if not values:
        return "none measured"
    p50, p99 = np.percentile(values, [50, 99])
    return f"p50 {p50:.2f} s, p99 {p99:.2f} s ({len(values):,} measured)"


@dataclass
class Measured:
    """What one run's processes did while the load ran (`seconds`), and after."""

    seconds: float
    answered: int
    settled: float
    # Per process: (servers, stored during the load, stored once it caught up); subscriber events,
    # gateway requests.
    events: dict[int, tuple[int, int, int]]
    requests: dict[int, tuple[int, int, int]]
    cpu: dict[int, float]  # pid: CPU seconds from the load's start to everything stored and diagnosed
    diagnosis: int  # the diagnosis process's pid
    simulator_cpu: float


def run(args: argparse.Namespace, subscribers: int, gateways: int, database_url: str) -> Measured:
    folder = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    fleets, described = start_fleets(args.servers, args.fleets)
    processes: list[subprocess.Popen[Any]] = []
    try:
        ids = [register_server(**{k: str(v) for k, v in d.items()}).pk for d in described]
        for pk in ids:
            scrape_server(pk)  # the block size and hash algorithm, from vllm:cache_config_info
        command = ["manage.py", "collect_kv_events", "--rescan-seconds", str(LEASE_SECONDS)]
        kv = [manage(command, database_url, folder / f"kv-{i}.log") for i in range(subscribers)]
        processes += kv
        fronts, shares = start_gateways(gateways, described, database_url, folder)
        processes += list(shares)
        wait_for(lambda: all(_listening(url) for url in fronts), timeout=120)
        wait_for(lambda: _shared(args.servers, subscribers), timeout=60 + 4 * LEASE_SECONDS * subscribers)
        holders = lease_holders()
        owned = {p.pid: [pk for pk, name in holders.items() if name.endswith(f":{p.pid}")] for p in kv}
        served = {p.pid: [ids[i] for i in share] for p, share in shares.items()}
        loop_log, wait = folder / "diagnosis.jsonl", str(args.diagnosis_delay)
        loop = ["-m", "bench", "fleet", "--diagnose-into", str(loop_log), "--diagnosis-delay", wait]
        diagnosis = manage(
            loop, database_url, folder / "diagnosis.log", PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS=wait
        )
        processes.append(diagnosis)
        with stream_positions() as positions:
            asyncio.run(
                drive(fronts, WARM_UP_SECONDS, args.concurrency, args.rate)
            )  # each gateway's first lookups
            wait_for(_caught_up(ids), timeout=180)
            cpu_before = {p.pid: cpu_seconds(p) for p in [*processes, *fleets]}
            before = _stored(owned, served)
            answered = asyncio.run(drive(fronts, args.seconds, args.concurrency, args.rate))
            during = _stored(owned, served)
            settled = max(0.0, wait_for(_caught_up(ids), timeout=180) - 1.0)
        wait_for(lambda: RequestDiagnosis.objects.count() >= RequestRecord.objects.count(), timeout=180)
        after = _stored(owned, served)
        events = {p: (len(pks), during[p] - before[p], after[p] - before[p]) for p, pks in owned.items()}
        requests = {p: (len(pks), during[p] - before[p], after[p] - before[p]) for p, pks in served.items()}
        cpu = {p.pid: cpu_seconds(p) - cpu_before[p.pid] for p in [*processes, *fleets]}
        measured = Measured(
            args.seconds,
            answered,
            settled,
            events,
            requests,
            cpu,
            diagnosis.pid,
            sum(cpu[f.pid] for f in fleets),
        )
        report(args, measured)
        runs = {line["now"]: line["done"] for line in map(json.loads, loop_log.read_text().splitlines())}
        print(f"  KV event emitted to stored: {percentiles(event_lags(positions))}")
        delay = args.diagnosis_delay
        print(f"  request answered to diagnosed: {percentiles(request_lags(runs))} (a record waits "
              f"{delay} s for late events, then up to {delay} s for a run)")  # fmt: skip
        return measured
    finally:
        for process in [*processes, *fleets]:
            process.terminate()
            process.wait(30)
        Server.objects.all().delete()


def _stored(owned: dict[int, list[int]], served: dict[int, list[int]]) -> dict[int, int]:
    """Per process: the KV event rows of the servers a subscriber leased, the request records of
    those a gateway fronts."""
    events = {pid: KVEvent.objects.filter(server_id__in=pks).count() for pid, pks in owned.items()}
    return events | {
        pid: RequestRecord.objects.filter(server_id__in=pks).count() for pid, pks in served.items()
    }


def report(args: argparse.Namespace, m: Measured) -> None:
    simulators = m.simulator_cpu / m.seconds
    print(f"{args.servers} servers in {args.fleets} simulator processes ({simulators:.2f} CPU s/s), "
          f"{len(m.events)} subscriber(s), {len(m.requests)} gateway(s): {m.answered / m.seconds:,.0f} "
          f"completions/s answered for {m.seconds:.0f} s, all events stored {m.settled:.1f} s after "
          "the load")  # fmt: skip
    for pid, (servers, during, events) in m.events.items():
        print(f"  collect_kv_events {pid}: {servers} servers, {during / m.seconds:,.0f} events/s stored "
              f"during the load, {_per_thousand(m.cpu[pid], events)} CPU per 1,000 events")  # fmt: skip
    for pid, (servers, during, requests) in m.requests.items():
        print(f"  gateway {pid}: {servers} servers, {during / m.seconds:,.0f} requests/s stored "
              f"during the load, {_per_thousand(m.cpu[pid], requests)} CPU per 1,000 requests")  # fmt: skip
    diagnosed = RequestDiagnosis.objects.count()
    print(f"  diagnosis {m.diagnosis}: {diagnosed:,} requests diagnosed, "
          f"{_per_thousand(m.cpu[m.diagnosis], diagnosed)} CPU per 1,000 requests")  # fmt: skip


def rate(m: Measured, found: dict[int, tuple[int, int, int]]) -> float:
    """Stored per second during the load, by every process of a kind."""
    return sum(during for _, during, _ in found.values()) / m.seconds


def _per_thousand(cpu: float, count: int) -> str:
    return f"{1000 * 1000 * cpu / count:.0f} ms" if count else "n/a"


def _shared(servers: int, subscribers: int) -> bool:
    """Every server leased, by every subscriber process."""
    holders = lease_holders()
    return len(holders) == servers and len(set(holders.values())) == subscribers


def _caught_up(ids: list[int]) -> Callable[[], bool]:
    """A condition true once no event was stored for a second (the subscribers caught up)."""
    last = [-1]

    def quiet() -> bool:
        stored = KVEvent.objects.filter(server_id__in=ids).count()
        if stored == last[0]:
            return True
        last[0] = stored
        time.sleep(1.0)
        return False

    return quiet


def diagnose_forever(into: Path, every: float) -> None:
    """The diagnosis process: each compatibility group in turn every `every` seconds, as the
    per-group tasks run; a JSON line per run: the `now` it stored as diagnosed_at, and its end."""
    with into.open("a") as out:
        while True:
            started = time.monotonic()
            for group in compatibility_groups():
                now = timezone.now()
                diagnosed = diagnose_requests(now=now, group=group)
                out.write(json.dumps({"now": now.isoformat(), "done": time.time(), "n": diagnosed}) + "\n")
                out.flush()
            time.sleep(max(0.0, every - (time.monotonic() - started)))


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--fleets", type=int, default=4, help="simulator processes")
    parser.add_argument("--subscribers", type=int, default=2)
    parser.add_argument("--gateways", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rate", type=float, default=0, help="completions a second (0: closed loop)")
    parser.add_argument("--diagnosis-delay", type=int, default=5)
    parser.add_argument("--diagnose-into", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.diagnose_into is not None:
        diagnose_forever(args.diagnose_into, every=args.diagnosis_delay)
        return
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
    with throwaway_database() as test_database:
        database_url = database_url_of(test_database)
        base = run(args, 1, 1, database_url)
        scaled = run(args, args.subscribers, args.gateways, database_url)
        events, requests = (
            rate(scaled, scaled.events) / rate(base, base.events),
            rate(scaled, scaled.requests) / rate(base, base.requests),
        )
        print(f"{args.subscribers} subscribers / {args.gateways} gateways against 1 / 1: events/s "
              f"x{events:.2f}, requests/s x{requests:.2f}; load average {os.getloadavg()[0]:.1f} "
              "at the end")  # fmt: skip
