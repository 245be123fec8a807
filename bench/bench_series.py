"""How long GET /api/v1/series, the server page and the template pages take over a week of minute rollups.

    DATABASE_URL=postgres://... .venv/bin/python -m bench series [--servers 20] [--runs 5]

Runs in a throw-away database (bench_series, created and dropped on the server DATABASE_URL names),
filled with a week of per-minute request rollups (two templates per server, TTFT histograms) and
loss rollups for every server. Each figure is the median of `runs` requests through Django's whole
stack in this process (PostgreSQL's own time included: it is the most of it), and its ratio to the
baseline, the fleet's hit rate over the last hour in minutes.
"""

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial

from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.fleet.models import Server
from app.prompts.models import Template, TemplateRepository
from app.traffic.services.rollups import refresh_minute_rollups
from bench.harness import throwaway_database

_NOW = "date_trunc('minute', now())"
_WEEK = f"generate_series({_NOW} - interval '7 days', {_NOW}, '1 minute')"
_HISTOGRAM = f"(SELECT array_agg(least(20, i)) FROM generate_series(1, {len(TTFT_BUCKETS_SECONDS) + 1}) i)"
# A week of minutes per server and template; the histogram a cumulative ramp over the buckets.
_FILL_SQL = f"""
INSERT INTO traffic_minuterollup (server_id, template_id, minute, requests, prompt_tokens, cached_tokens,
    cache_known_prompt_tokens, client_ttft_count, client_ttft_sum_seconds, client_ttft_buckets,
    server_ttft_count, server_ttft_sum_seconds, server_ttft_buckets, prefill_count, prefill_uncached_sum,
    prefill_ttft_sum, prefill_uncached_squares, prefill_cross_sum)
SELECT s.id, t.id, m, 20, 40000, 20000 + (extract(minute FROM m)::int * 100), 40000, 20, 8.0,
       {_HISTOGRAM}, 20, 6.0, {_HISTOGRAM},
       0, 0, 0, 0, 0
FROM fleet_server s, prompts_template t,
     {_WEEK} m
"""
_LOSS_SQL = f"""
INSERT INTO traffic_lossminute (server_id, template_id, template_version_id, tenant, minute, requests,
    diagnosed, unexpected_hits, prompt_tokens, diagnosed_prompt_tokens, seen_before_tokens,
    resident_anywhere_tokens,
    resident_here_tokens, reused_tokens, prompt_changed_tokens, evicted_tokens, routed_elsewhere_tokens,
    salt_tokens, restarted_tokens, below_block_tokens, cold_tokens, unexplained_tokens, no_kv_events_tokens)
SELECT s.id, NULL, NULL, 'acme', m, 20, 20, 0, 40000, 40000, 30000, 25000, 20000, 20000, 5000, 3000, 2000,
       0, 0, 300, 1000, 0, 0
FROM fleet_server s,
     {_WEEK} m
"""


def median_ms(runs: int, call: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def fill(servers: int) -> int:
    repository = TemplateRepository.objects.create(name="bench", location="/nowhere", globs=["*.j2"])
    for name in ("support", "search"):
        Template.objects.create(repository=repository, name=name, path=f"{name}.j2")
    for n in range(servers):
        Server.objects.create(name=f"vllm-{n}", base_url=f"http://127.0.0.1:{9000 + n}", block_size=16)
    with connection.cursor() as cursor:
        cursor.execute(_FILL_SQL)
        rows = int(cursor.rowcount)
        cursor.execute(_LOSS_SQL)
        rows += int(cursor.rowcount)
    # The hours from those minutes, by the service that keeps them (no raw records: minutes unchanged).
    now = timezone.now()
    refresh_minute_rollups(since=now - timedelta(days=7, hours=1), until=now + timedelta(minutes=1))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE traffic_minuterollup")
        cursor.execute("ANALYZE traffic_hourrollup")
        cursor.execute("ANALYZE traffic_lossminute")
    return rows


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    figures: list[tuple[str, float]] = []
    with throwaway_database("bench_series"):
        rows = fill(args.servers)
        client = Client()
        client.force_login(User.objects.create_user("bench"))
        calls = {
            "fleet hit_rate 1h/60 s (baseline)": "/api/v1/series?metric=hit_rate&bucket=60",
            "fleet hit_rate 24h/900 s": "/api/v1/series?metric=hit_rate&bucket=900&since={day}",
            "fleet hit_rate 7d/3600 s": "/api/v1/series?metric=hit_rate&bucket=3600&since={week}",
            "fleet ttft_p99 7d/3600 s": "/api/v1/series?metric=ttft_p99&bucket=3600&since={week}",
            "fleet lost_tokens 7d/3600 s": "/api/v1/series?metric=lost_tokens&bucket=3600&since={week}",
            "server hit_rate 7d/3600 s": "/api/v1/series?metric=hit_rate&scope=server&id=vllm-0&bucket=3600"
            "&since={week}",
            "server ttft_p99 7d/3600 s CSV": "/api/v1/series?metric=ttft_p99&scope=server&id=vllm-0"
            "&bucket=3600"
            "&since={week}&format=csv",
            "server page 1h": "/servers/vllm-0/",
            "server page 7d": "/servers/vllm-0/?window=7d",
            "templates list 1h": "/templates/",
            "templates list 7d": "/templates/?window=7d",
            "template page 1h": "/templates/{support}/",
            "template page 7d": "/templates/{support}/?window=7d",
        }  # fmt: skip
        now = timezone.now()
        times = {"day": int(now.timestamp() - 86400), "week": int(now.timestamp() - 7 * 86400),
                 "support": Template.objects.get(name="support").pk}  # fmt: skip
        for name, url in calls.items():
            target = url.format(**times)
            assert client.get(target).status_code == 200, target
            figures.append((name, median_ms(args.runs, partial(client.get, target))))
    print(
        f"{args.servers} servers x 2 templates, a week of minute rollups ({rows:,} rows with the hours), "
        f"median of {args.runs}"
    )
    baseline = figures[0][1]
    for name, ms in figures:
        print(f"{name:34s} {ms:8.1f} ms  x{ms / baseline:6.1f}")
