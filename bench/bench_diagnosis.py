"""Requests diagnosed per second online (the kept replay, a run every --every seconds of traffic),
against one replay of the whole trace from the database (what every run did before).

    DATABASE_URL=postgres://... .venv/bin/python -m bench diagnosis [--requests 20000]

Runs in a throw-away database on the server DATABASE_URL names. The trace: --requests prompts of
about 2,000 tokens (8 templates with stable prefixes of 1,500-1,900 tokens, tails of 64-400; from
the middle of the trace on, two templates carry 6 volatile tokens near their top) arriving at
--rate per second on 4 servers of block size 16 (each template mostly on one server, one request
in ten anywhere). Each server is the simulator's prefix cache (simulator/cache.py) of --blocks
blocks, so cached tokens and KV events are what vLLM would report; the events go through vLLM's
wire encoding, the collector's decoder and its store (store_kv_events), the records through the
ingest (ingest_request_records), as in production. Untimed.

Timed: the online runs (app.diagnosis.run.diagnose_requests, the process keeping its
replay), then, the diagnoses deleted, one run replaying the whole trace from the database. Both
print requests per second of wall time and of this process's CPU time (the worker core: waiting
on PostgreSQL is not counted), and the ratio of the two.

--dump PATH writes the online run's diagnoses, then the baseline's, one JSON line each in a
canonical order with every moment as seconds from the trace's start: a change meant to be faster
only must leave the file byte-identical (`cmp` two dumps of the same --requests).
"""

import argparse
import cProfile
import json
import os
import random
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TextIO

from django.conf import settings
from django.utils import timezone

from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.fleet.models import Server
from app.fleet.services import register_server
from app.traffic.collection.kv_collector import event_rows
from app.traffic.models import RequestDiagnosis
from app.traffic.services.kv_events import KVEventRow, StreamPosition, store_kv_events
from app.traffic.services.requests import ingest_request_records
from bench.harness import throwaway_database
from collectors.kv_events.parse import decode_sub_message
from collectors.records import RequestFacts
from simulator.cache import PrefixCache
from simulator.kv_events import encode_batch, seq_frame

BLOCK_SIZE = 16
SERVERS = 4
TEMPLATES = 8
VOCABULARY = 151_936
BATCH = 500


class Trace:
    """The prompts, in arrival order, with the server each was routed to."""

    def __init__(self, requests: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.prefixes = [
            [rng.randrange(VOCABULARY) for _ in range(rng.randrange(1500, 1900))] for _ in range(8)
        ]
        self.prompts: list[tuple[int, int, list[int]]] = []  # (template, server, token ids)
        for n in range(requests):
            template = n % TEMPLATES
            tokens = list(self.prefixes[template])
            if template in (2, 5) and n >= requests // 2:  # a volatile id near the top
                tokens[40:40] = [rng.randrange(VOCABULARY) for _ in range(6)]
            tokens += [rng.randrange(VOCABULARY) for _ in range(rng.randrange(64, 400))]
            server = template % SERVERS if rng.random() > 0.1 else rng.randrange(SERVERS)
            self.prompts.append((template, server, tokens))


def store_trace(trace: Trace, servers: list[Server], *, blocks: int, start: datetime, rate: float) -> None:
    """Serve the trace on the simulated caches and store its records and events, as production does."""
    caches = [PrefixCache(BLOCK_SIZE, blocks) for _ in servers]
    facts: list[RequestFacts] = []
    rows: list[KVEventRow] = []
    seqs = [0] * len(servers)
    for n, (template, server, tokens) in enumerate(trace.prompts):
        arrived_at = start + timedelta(seconds=n / rate)
        cache, target = caches[server], servers[server]
        admission = cache.admit(f"r{n}", tokens)
        cache.finish(f"r{n}")
        emitted = (arrived_at + timedelta(milliseconds=1)).timestamp()
        payload = encode_batch(emitted, cache.take_events(), None)
        message = decode_sub_message([b"kv@bench", seq_frame(seqs[server]), payload])
        rows += event_rows(
            message.batch, server_id=target.pk, epoch=0, seq=seqs[server], received_at=arrived_at
        )
        seqs[server] += 1
        facts.append(
            RequestFacts(
                request_id=f"r{n}", arrived_at=arrived_at, server=target.name, model="bench",
                template=f"template-{template}", prompt_tokens=len(tokens),
                cached_tokens=admission.cached_tokens, client_ttft_seconds=0.05, prompt_token_ids=tokens,
            )
        )  # fmt: skip
        if len(facts) == BATCH:
            _flush(facts, rows, servers, seqs, now=arrived_at)
    _flush(facts, rows, servers, seqs, now=start + timedelta(seconds=len(trace.prompts) / rate))


def _flush(
    facts: list[RequestFacts],
    rows: list[KVEventRow],
    servers: list[Server],
    seqs: list[int],
    *,
    now: datetime,
) -> None:
    positions = [
        StreamPosition(server_id=s.pk, dp_rank=0, epoch=0, last_seq=seqs[i] - 1, last_event_at=now)
        for i, s in enumerate(servers)
        if seqs[i]
    ]
    store_kv_events(rows=rows, positions=positions)
    ingest_request_records(facts, source="gateway", now=now)
    facts.clear()
    rows.clear()


def timed(run: Callable[[], int]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds of this process, and what `run` returned. Prints the CPU seconds
    in user and system mode (the kernel's share: pages first touched, the sockets)."""
    wall, cpu, before = time.perf_counter(), time.process_time(), os.times()
    found = run()
    after = os.times()
    print(f"  CPU: {after.user - before.user:.2f} s user, {after.system - before.system:.2f} s system")
    return time.perf_counter() - wall, time.process_time() - cpu, found


def dump_diagnoses(out: TextIO, run: str, *, start: datetime) -> None:
    """Every stored diagnosis as a JSON line, by arrival, server and request id; moments as seconds
    from `start` (the trace's start moves with the clock), the row's own diagnosed_at left out."""

    def since_start(value: object) -> object:
        if isinstance(value, datetime):
            return round((value - start).total_seconds(), 6)
        return value

    rows = RequestDiagnosis.objects.order_by("arrived_at", "server_id", "request_id").values()
    for row in rows.iterator(chunk_size=2000):
        row.pop("diagnosed_at")
        for loss in row["losses"]:
            for name in ("stored_at", "removed_at"):
                if name in loss:
                    loss[name] = since_start(datetime.fromisoformat(loss[name]))
        found = {name: since_start(value) for name, value in row.items()}
        out.write(json.dumps([run, found], sort_keys=True, default=str) + "\n")


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=2_000, help="arrivals per second of the trace")
    parser.add_argument("--every", type=float, default=2.0, help="seconds of traffic between runs")
    parser.add_argument("--blocks", type=int, default=6_000, help="KV cache blocks per server")
    parser.add_argument("--repeat", type=int, default=1, help="online measures, the trace stored once")
    parser.add_argument("--profile", help="write the first online measure's cProfile stats here")
    parser.add_argument("--dump", help="write the diagnoses here, canonically (see the docstring)")
    args = parser.parse_args(argv)
    dump = open(args.dump, "w") if args.dump else None  # noqa: SIM115
    with throwaway_database():
        servers = [
            register_server(name=f"bench-{n}", base_url=f"http://10.0.0.{n + 1}:8000", model="bench")
            for n in range(SERVERS)
        ]
        Server.objects.update(block_size=BLOCK_SIZE, hash_algo="sha256_cbor")
        span = args.requests / args.rate
        start = timezone.now().astimezone(UTC) - timedelta(seconds=span + 120)
        store_trace(Trace(args.requests), servers, blocks=args.blocks, start=start, rate=args.rate)
        print(f"{args.requests} requests of about 2,000 tokens, {span:.0f} s of traffic at {args.rate:.0f}/s")
        delay = timedelta(seconds=settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS)
        runs = [start + timedelta(seconds=args.every * (k + 1)) for k in range(int(span / args.every) + 1)]

        def online() -> int:
            return sum(diagnose_requests(now=until + delay) for until in runs)

        for attempt in range(args.repeat):  # the trace is stored once: its setup costs the most
            forget_kept_replay()
            profiler = cProfile.Profile(time.process_time)  # CPU time: waits on PostgreSQL are not
            measured = profiler.runcall if args.profile and attempt == 0 else lambda run: run()
            wall, cpu, online_count = timed(lambda: measured(online))  # noqa: B023 (called at once)
            if args.profile and attempt == 0:
                profiler.dump_stats(args.profile)
            print(f"online, a run every {args.every:g} s of traffic ({len(runs)} runs): {online_count} done")
            print(f"  {online_count / wall:8,.0f} requests/s wall, {online_count / cpu:8,.0f} per CPU second")
            if dump and attempt == 0:
                dump_diagnoses(dump, "online", start=start)
            RequestDiagnosis.objects.all().delete()
        forget_kept_replay()
        base_wall, base_cpu, replayed = timed(lambda: diagnose_requests(now=runs[-1] + delay))
        print(f"baseline, one replay of the whole trace from the database: {replayed} diagnosed")
        print(f"  {replayed / base_wall:8,.0f} requests/s wall, {replayed / base_cpu:8,.0f} per CPU second")
        if dump:
            dump_diagnoses(dump, "baseline", start=start)
        print(f"ratio online / baseline: {base_wall / wall * online_count / replayed:.2f} (wall)")
        if dump:
            dump.close()
