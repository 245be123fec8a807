"""How long the Fleet page takes for a fleet with a week of rollups, per window.

    DATABASE_URL=postgres://... .venv/bin/python -m bench fleet_page [--servers 100] [--runs 5]

Runs in a throw-away database (bench_fleet, created and dropped on the server DATABASE_URL names),
filled with a week of per-minute server readings, request rollups and loss rollups for every server,
and the hours summed from them by the services that keep them. Each figure is the median of `runs`
requests through Django's whole stack in this process (PostgreSQL's time included), and its ratio
to the baseline, the page over the last hour.
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
from app.traffic.services.rollups import refresh_loss_minutes, refresh_minute_rollups
from app.traffic.services.server_rollups import refresh_server_minutes
from bench.harness import throwaway_database

_NOW = "date_trunc('minute', now())"
_WEEK = f"generate_series({_NOW} - interval '7 days', {_NOW}, '1 minute')"
_HISTOGRAM = f"(SELECT array_agg(least(20, i)) FROM generate_series(1, {len(TTFT_BUCKETS_SECONDS) + 1}) i)"
_SERVER_SQL = f"""
INSERT INTO traffic_serverminute (server_id, minute, scrapes, failed_scrapes, prefix_queries, prefix_hits,
    preemptions, finished_requests, kv_usage_sum, kv_usage_samples, kv_usage_max, ttft_count,
    ttft_sum_seconds, ttft_buckets, evictions)
SELECT s.id, m, 4, 0, 40000, 20000 + extract(minute FROM m)::int * 100, 1, 20, 2.4, 4, 0.7, 20, 6.0,
       {_HISTOGRAM}, 30
FROM fleet_server s, {_WEEK} m
"""
_REQUEST_SQL = f"""
INSERT INTO traffic_minuterollup (server_id, template_id, minute, requests, prompt_tokens, cached_tokens,
    cache_known_prompt_tokens, client_ttft_count, client_ttft_sum_seconds, client_ttft_buckets,
    server_ttft_count, server_ttft_sum_seconds, server_ttft_buckets, prefill_count, prefill_uncached_sum,
    prefill_ttft_sum, prefill_uncached_squares, prefill_cross_sum)
SELECT s.id, NULL, m, 20, 40000, 20000, 40000, 20, 8.0, {_HISTOGRAM}, 20, 6.0, {_HISTOGRAM}, 0, 0, 0, 0, 0
FROM fleet_server s, {_WEEK} m
"""
_LOSS_SQL = f"""
INSERT INTO traffic_lossminute (server_id, template_id, template_version_id, tenant, minute, requests,
    diagnosed, unexpected_hits, prompt_tokens, diagnosed_prompt_tokens, seen_before_tokens,
    resident_anywhere_tokens, resident_here_tokens, reused_tokens, prompt_changed_tokens, evicted_tokens,
    routed_elsewhere_tokens, salt_tokens, restarted_tokens, below_block_tokens, cold_tokens,
    unexplained_tokens, no_kv_events_tokens)
SELECT s.id, NULL, NULL, '', m, 20, 20, 0, 40000, 40000, 30000, 25000, 20000, 20000, 5000, 3000, 2000,
       0, 0, 300, 1000, 0, 0
FROM fleet_server s, {_WEEK} m
"""


def median_ms(runs: int, call: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def fill(servers: int) -> int:
    for n in range(servers):
        Server.objects.create(
            name=f"vllm-{n}",
            base_url=f"http://127.0.0.1:{9000 + n}",
            model="tiny",
            last_scraped_at=timezone.now(),
        )
    rows = 0
    with connection.cursor() as cursor:
        for sql in (_SERVER_SQL, _REQUEST_SQL, _LOSS_SQL):
            cursor.execute(sql)
            rows += int(cursor.rowcount)
    # The hours from those minutes, by the services that keep them (no raw rows: minutes unchanged).
    now = timezone.now()
    week = {"since": now - timedelta(days=7, hours=1), "until": now + timedelta(minutes=1)}
    for refresh in (refresh_server_minutes, refresh_minute_rollups, refresh_loss_minutes):
        refresh(**week)
    with connection.cursor() as cursor:
        for table in ("serverminute", "serverhour", "minuterollup", "hourrollup", "lossminute", "losshour"):
            cursor.execute(f"ANALYZE traffic_{table}")
    return rows


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    figures: list[tuple[str, float, int]] = []
    with throwaway_database("bench_fleet"):
        rows = fill(args.servers)
        client = Client()
        client.force_login(User.objects.create_user("bench"))
        calls = {
            "page 1h (baseline)": ("/", {}), "page 6h": ("/?window=6h", {}), "page 24h": ("/?window=24h", {}),
            "page 7d": ("/?window=7d", {}), "htmx refresh 1h": ("/", {"HX-Request": "true"}),
            "htmx refresh 7d": ("/?window=7d", {"HX-Request": "true"}),
            "sparklines CSV 7d": ("/?window=7d&format=csv", {}),
        }  # fmt: skip
        for name, (url, headers) in calls.items():
            answer = client.get(url, headers=headers)
            assert answer.status_code == 200, url
            figures.append(
                (name, median_ms(args.runs, partial(client.get, url, headers=headers)), len(answer.content))
            )
    print(f"{args.servers} servers, a week of three minute rollups ({rows:,} rows), median of {args.runs}")
    baseline = figures[0][1]
    for name, ms, size in figures:
        print(f"{name:22s} {ms:8.1f} ms  x{ms / baseline:5.2f}  {size / 1024:7.0f} KiB")
