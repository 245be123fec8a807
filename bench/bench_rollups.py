"""How long the request rollup refresh takes with the TTFT sketches, against the same refresh
without them (its baseline), in one run over the same records.

    DATABASE_URL=postgres://... .venv/bin/python -m bench rollups [--servers 10] [--rounds 5]

Runs in a throw-away database (bench_rollups, created and dropped on the server DATABASE_URL names),
filled with an hour of request records (600 a minute: 36,000, over the servers and four templates
and none, client and server TTFTs). Times refresh_minute_rollups over the whole hour and over the
5-minute lookback the minute task refreshes, with sketches and without (sketches=False: the sums
they add to), the two interleaved round by round. Each figure is the best of `rounds` in wall time,
and the PostgreSQL backend's CPU time (utime + stime from /proc, when the server runs on this
machine) averaged over the rounds.
"""

import argparse
import random
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from app.fleet.models import Server
from app.prompts.models import Template
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import RequestRecord
from app.traffic.services.partitions import ensure_day_partitions
from bench.harness import backend_cpu, backend_pid, print_figure, throwaway_database

PER_MINUTE = 600


def fill(servers: int) -> tuple[int, datetime]:
    """An hour of records ending at the last whole minute; returns how many and the hour's end."""
    hosts = [
        Server.objects.create(name=f"vllm-{n}", base_url=f"http://vllm-{n}:8000") for n in range(servers)
    ]
    templates = [Template.objects.create(name=f"tpl-{n}") for n in range(4)] + [None]
    end = timezone.now().replace(second=0, microsecond=0)
    start, noise, rows = end - timedelta(hours=1), random.Random(7), []
    for n in range(60 * PER_MINUTE):
        ttft = 0.131 * noise.lognormvariate(0, 0.35)
        rows.append(RequestRecord(
            server=hosts[n % servers], template=templates[n % 5], request_id=f"r{n}", source="rest",
            arrived_at=start + timedelta(seconds=n * 3600 / (60 * PER_MINUTE)), prompt_tokens=2000,
            cached_tokens=noise.choice((0, 1000, 1984)), client_ttft_seconds=ttft,
            server_ttft_seconds=None if n % 7 == 0 else ttft * 0.8,
        ))  # fmt: skip
    ensure_day_partitions(RequestRecord, [start, end])
    RequestRecord.objects.bulk_create(rows, batch_size=2000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE traffic_requestrecord")
    return len(rows), end


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with throwaway_database("bench_rollups", partitions=False):
        count, end = fill(args.servers)
        backend = backend_pid()
        spans = {"hour": timedelta(hours=1), "5-minute lookback": timedelta(minutes=5)}
        walls: dict[tuple[str, bool], list[float]] = {}
        cpus: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds + 1):  # the first round warms the caches: not counted
            for span, length in spans.items():
                for sketches in (False, True):
                    cpu_before, started = backend_cpu(backend), time.perf_counter()
                    refresh_minute_rollups(since=end - length, until=end, sketches=sketches)
                    wall, cpu_after = time.perf_counter() - started, backend_cpu(backend)
                    walls.setdefault((span, sketches), []).append(wall)
                    if cpu_before is not None and cpu_after is not None:
                        cpus.setdefault((span, sketches), []).append(cpu_after - cpu_before)
    print(f"{count:,} records over an hour, {args.servers} servers x 5 templates; best of {args.rounds}")
    for span in spans:
        base_wall = min(walls[(span, False)][1:])
        for sketches in (False, True):
            wall = min(walls[(span, sketches)][1:])
            used = cpus.get((span, sketches), [])[1:]
            cpu_ms = f"PostgreSQL CPU {1000 * sum(used) / len(used):.0f} ms" if used else "(no CPU figure)"
            label = f"{span}, {'with sketches' if sketches else 'without (baseline)'}"
            print_figure(label, 1000 * wall, "ms wall", 1000 * base_wall, cpu_ms)
