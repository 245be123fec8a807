"""A trace analysed end to end, JSON lines to diagnoses, killers and rollups, against prefixlens 0.1.0.

    DATABASE_URL=postgres://... .venv/bin/python -m bench analysis [--requests 20000]
        [--block-sizes 16,32] [--work /tmp/ps-bench-analysis]

--requests 2000 for a quick run. Without a PostgreSQL at hand, app.devservices.start_embedded_postgres
gives one (it stops with the process that started it: run the bench as that process's child).

The trace (bench/analysis_trace.py, written untimed into --work): --requests prompts of 8 templates
(stable prefixes of 512-3,000 tokens, tails of 64-400; from the middle on, two templates carry 6
volatile tokens at token 40), about 36 million tokens at 20,000, arriving over 20 minutes that end
3 minutes before the run, on one server with no KV events. Cached tokens are what an unlimited prefix
cache of the block size would have reused (the longest run of full blocks seen before), so one file per
block size; prefixlens is run with an unlimited cache too (--capacity-blocks 10**9), the same model.

Prefixscope, in a child process per block size (`--side prefixscope`), in a throw-away database on the
server DATABASE_URL names (created and migrated by this process, untimed; the child registers the
server with the block size, untimed; the diagnosis lookback and the killer window are widened to a
day, so that they cover the trace however long ago it was written). Timed, wall:
  import    the file read and decoded (msgspec), ingested by ingest_request_records in batches of
            500 (source "rest", as the REST API's batches), block hashes, token ids and templates
            stored;
  diagnose  diagnose_requests (causes and funnel of every record, and the per-minute loss rollups),
            then refresh_minute_rollups over the trace's minutes;
  killers   find_all_killers, what the task compare.find_killers runs (every template's most recent
            PREFIXSCOPE_KILLER_MAX_REQUESTS, token mode; the killers classified with the bundled
            tokenizer, as the server's /detokenize does not answer).
Prefix families: the records carry their template's name, so none are inferred.

prefixlens 0.1.0, installed from the package registry into its own virtualenv (--work), runs
`prefixlens analyze TRACE --block-size B --capacity-blocks 1000000000 --json`, timed wall from its
start to its exit (its interpreter's start included; the Prefixscope child's Django start is not).

Peak memory: each child's maximum resident set (os.wait4's ru_maxrss), Django's own included for
Prefixscope. PostgreSQL is a process of its own: its memory is not in Prefixscope's figure.
Target: prefixlens / Prefixscope >= 10 end to end, Prefixscope's peak no higher.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from app.compare.killers import find_all_killers
from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.fleet.services import register_server
from app.prompts.models import CacheKiller
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import RequestDiagnosis
from app.traffic.services.partitions import maintain_partitions
from app.traffic.services.requests import ingest_request_records
from bench.analysis_trace import SERVER, write_traces
from bench.harness import throwaway_database
from collectors.records import RequestFacts

PREFIXLENS = "prefixlens==0.1.0"
BATCH = 500
TRACE_SECONDS = 20 * 60
TRACE_ENDS_BEFORE = timedelta(minutes=3)
UNLIMITED_BLOCKS = 10**9
# The server's base URL: nothing listens there, so the killers' text comes from the bundled tokenizer.
SERVER_URL = "http://127.0.0.1:9"


class TraceLine(msgspec.Struct):
    """One line of the trace (bench/analysis_trace.py)."""

    request_id: str
    arrived_at: datetime
    server: str
    model: str
    tags: dict[str, str]
    prompt_tokens: int
    cached_tokens: int
    token_ids: list[int]


def import_trace(path: Path) -> tuple[datetime, datetime, int]:
    """Ingest the trace's lines in batches of BATCH; returns the first and last arrival and the
    records stored."""
    decode = msgspec.json.Decoder(TraceLine).decode
    first = last = None
    stored = 0
    batch: list[RequestFacts] = []
    with path.open("rb") as lines:
        for raw in lines:
            line = decode(raw)
            first, last = first or line.arrived_at, line.arrived_at
            batch.append(
                RequestFacts(
                    request_id=line.request_id, arrived_at=line.arrived_at, server=line.server,
                    model=line.model, template=line.tags.get("template", ""),
                    prompt_tokens=line.prompt_tokens, cached_tokens=line.cached_tokens,
                    prompt_token_ids=line.token_ids,
                )
            )  # fmt: skip
            if len(batch) == BATCH:
                stored += ingest_request_records(batch, source="rest", now=timezone.now()).stored
                batch = []
    if batch:
        stored += ingest_request_records(batch, source="rest", now=timezone.now()).stored
    assert first is not None and last is not None, "an empty trace"
    return first, last, stored


def prefixscope_side(trace: Path, block_size: int, database: str) -> dict[str, Any]:
    """The Prefixscope side in this process, against `database` (created and migrated): seconds per
    step and what was found."""
    settings.DEBUG = False  # no query log
    settings.DATABASES["default"]["NAME"] = connection.settings_dict["NAME"] = database
    connection.close()
    settings.PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES = settings.PREFIXSCOPE_KILLER_WINDOW_MINUTES = 24 * 60
    register_server(name=SERVER, base_url=SERVER_URL, model="bench")
    Server.objects.update(block_size=block_size, hash_algo="sha256_cbor")
    maintain_partitions(now=timezone.now())
    started = time.perf_counter()
    first, last, stored = import_trace(trace)
    imported = time.perf_counter()
    diagnosed = diagnose_requests(now=timezone.now())
    refresh_minute_rollups(since=first, until=last + timedelta(microseconds=1))
    rolled_up = time.perf_counter()
    killers = find_all_killers(now=timezone.now())
    done = time.perf_counter()
    causes = Counter(
        d.cause or d.unknown or "reused" for d in RequestDiagnosis.objects.only("cause", "unknown")
    )
    sums = RequestDiagnosis.objects.aggregate(prompt=Sum("prompt_tokens"), reused=Sum("reused_tokens"))
    found = [
        f"{k.template.name}@{k.position_token}:{k.kind}"
        for k in CacheKiller.objects.select_related("template").order_by("template__name", "-tokens_lost")
    ]
    return {
        "import": imported - started, "diagnose": rolled_up - imported, "killers": done - rolled_up,
        "total": done - started, "stored": stored, "diagnosed": diagnosed, "causes": dict(causes),
        "killer_count": killers, "found": found,
        "reused": sums["reused"] / sums["prompt"],
    }  # fmt: skip


def ensure_prefixlens(venv: Path) -> Path:
    """The prefixlens command of a virtualenv holding prefixlens 0.1.0, made when missing."""
    command = venv / "bin" / "prefixlens"
    if not command.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, PREFIXLENS], check=True, stderr=subprocess.DEVNULL)
    return command


def run_child(command: list[str]) -> tuple[float, float, str]:
    """Run `command`; its wall seconds, peak resident set in MB (its own: os.wait4) and stdout."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{command[0]} ... exited with {child.returncode}")
    return seconds, usage.ru_maxrss / 1024, out.decode()


def compare(trace: Path, block_size: int, prefixlens: Path) -> dict[str, Any]:
    """Both sides on one trace: Prefixscope's child in a fresh database, then prefixlens."""
    with throwaway_database(partitions=False) as database:
        connection.close()
        _, ours_mb, out = run_child(
            [sys.executable, "-m", "bench", "analysis", "--side", "prefixscope",
             "--block-size", str(block_size), "--trace", str(trace), "--database", database]
        )  # fmt: skip
    ours = json.loads(out.splitlines()[-1])
    theirs_seconds, theirs_mb, report = run_child(
        [str(prefixlens), "analyze", str(trace), "--block-size", str(block_size),
         "--capacity-blocks", str(UNLIMITED_BLOCKS), "--json"]
    )  # fmt: skip
    return {
        **ours, "mb": ours_mb, "prefixlens": theirs_seconds, "prefixlens_mb": theirs_mb,
        "prefixlens_hit_rate": json.loads(report)["hit_rate"],
    }  # fmt: skip


def print_table(rows: dict[int, dict[str, Any]]) -> None:
    """One row per block size: Prefixscope's seconds by step, prefixlens', the ratio, both peaks."""
    print()
    print("        ----------- Prefixscope, s -----------  prefixlens  ratio     peak MB")
    print("block   import  diagnose  killers     total           s  pl/ps     ours  prefixlens")
    for size, r in rows.items():
        seconds = f"{r['import']:8.2f}  {r['diagnose']:8.2f}  {r['killers']:7.2f}  {r['total']:8.2f}"
        ratio = r["prefixlens"] / r["total"]
        peaks = f"{r['mb']:8,.0f}  {r['prefixlens_mb']:10,.0f}"
        print(f"{size:>5} {seconds}  {r['prefixlens']:10.2f}  {ratio:5.2f} {peaks}")
    print("target: ratio >= 10, Prefixscope's peak no higher than prefixlens'")
    print("diagnose: diagnose_requests (causes, funnel, loss rollups) and refresh_minute_rollups")
    print("peak MB: each child's max RSS; PostgreSQL's memory (a process of its own) is not in Prefixscope's")


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--block-sizes", default="16,32", help="comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ps-bench-analysis"), help="traces, venv")
    parser.add_argument("--side", choices=["prefixscope"], help="(internal) run one side in this process")
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--database")
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(prefixscope_side(args.trace, args.block_size, args.database)))
        return
    block_sizes = [int(size) for size in args.block_sizes.split(",")]
    prefixlens = ensure_prefixlens(args.work / "prefixlens-venv")
    start = datetime.now(UTC) - TRACE_ENDS_BEFORE - timedelta(seconds=TRACE_SECONDS)
    traces, tokens = write_traces(
        args.work, requests=args.requests, block_sizes=block_sizes, start=start, seconds=TRACE_SECONDS
    )
    print(f"{args.requests:,} requests, {tokens:,} prompt tokens, 8 templates, one server")
    rows = {}
    for size in block_sizes:
        rows[size] = r = compare(traces[size], size, prefixlens)
        print(
            f"block size {size}: {r['stored']:,} stored, {r['diagnosed']:,} diagnosed {r['causes']}; "
            f"{r['killer_count']} killers {r['found']}; tokens reused {r['reused']:.3f}, "
            f"prefixlens hit rate {r['prefixlens_hit_rate']:.3f}"
        )
    print_table(rows)
