"""How long GET /api/v1/series, the server page and the template pages take over a week of rollups.

    DATABASE_URL=postgres://... .venv/bin/python -m bench series [--servers 20] [--records 1000000] [--runs 5]

Runs in a throw-away database (bench_series, created and dropped on the server DATABASE_URL names),
filled as bench_pages fills its own (bench/pages_load.py: --records request records over a week on
--servers servers and 30 templates, their diagnoses, the minute and hour rollups computed from them
by the product's services). Each figure is the median of `runs` requests through Django's whole
stack in this process (PostgreSQL's own time included: it is the most of it), and its ratio to the
baseline, the fleet's hit rate over the last hour in minutes.
"""

import argparse
from collections.abc import Sequence

from django.contrib.auth.models import User
from django.test import Client

from bench import pages_load
from bench.harness import print_baseline, print_figure, throwaway_database, time_pages


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    with throwaway_database("bench_series"):
        fleet = pages_load.load_rollup_fleet(servers=args.servers, days=7, records=args.records)
        client = Client()
        client.force_login(User.objects.get(username="bench-admin"))
        now, server, template = fleet.anchor.timestamp(), "vllm-000", int(fleet.template_ids[0])
        day, week = int(now - 86400), int(now - 7 * 86400)
        pages = time_pages(client, {
            "fleet hit_rate 1h/60 s": "/api/v1/series?metric=hit_rate&bucket=60",
            "fleet hit_rate 24h/900 s": f"/api/v1/series?metric=hit_rate&bucket=900&since={day}",
            "fleet hit_rate 7d/3600 s": f"/api/v1/series?metric=hit_rate&bucket=3600&since={week}",
            "fleet ttft_p99 7d/3600 s": f"/api/v1/series?metric=ttft_p99&bucket=3600&since={week}",
            "fleet lost_tokens 7d/3600 s": f"/api/v1/series?metric=lost_tokens&bucket=3600&since={week}",
            "server hit_rate 7d/3600 s":
                f"/api/v1/series?metric=hit_rate&scope=server&id={server}&bucket=3600&since={week}",
            "server ttft_p99 7d/3600 s CSV":
                f"/api/v1/series?metric=ttft_p99&scope=server&id={server}&bucket=3600&since={week}&format=csv",
            "server page 1h": f"/servers/{server}/", "server page 7d": f"/servers/{server}/?window=7d",
            "templates list 1h": "/templates/", "templates list 7d": "/templates/?window=7d",
            "template page 1h": f"/templates/{template}/",
            "template page 7d": f"/templates/{template}/?window=7d",
        }, args.runs)  # fmt: skip
    print(f"{args.servers} servers, {args.records:,} request records over a week, median of {args.runs}")
    baseline = pages[0].timings.p50
    print_baseline(pages[0].name, baseline, "ms")
    for page in pages[1:]:
        print_figure(page.name, page.timings.p50, "ms", baseline)
