"""How long the Fleet page takes for a fleet with a week of rollups, per window.

    DATABASE_URL=postgres://... .venv/bin/python -m bench fleet_page [--servers 100] [--records 1000000] \
        [--runs 5]

Runs in a throw-away database (bench_fleet, created and dropped on the server DATABASE_URL names),
filled as bench_pages fills its own (bench/pages_load.py: --records request records over a week on
--servers servers, their diagnoses, the request, loss and server rollups computed from them by the
product's services). Each figure is the median of `runs` requests through Django's whole stack in
this process (PostgreSQL's time included), and its ratio to the baseline, the page over the last hour.
"""

import argparse
from collections.abc import Sequence

from django.contrib.auth.models import User
from django.test import Client

from bench import pages_load
from bench.harness import print_baseline, print_figure, throwaway_database, time_pages

HTMX = {"HX-Request": "true"}


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    with throwaway_database("bench_fleet"):
        pages_load.load_rollup_fleet(servers=args.servers, days=7, records=args.records)
        client = Client()
        client.force_login(User.objects.get(username="bench-admin"))
        pages = time_pages(client, {
            "page 1h": "/", "page 6h": "/?window=6h", "page 24h": "/?window=24h", "page 7d": "/?window=7d",
            "htmx refresh 1h": ("/", HTMX), "htmx refresh 7d": ("/?window=7d", HTMX),
            "sparklines CSV 7d": "/?window=7d&format=csv",
        }, args.runs)  # fmt: skip
    print(f"{args.servers} servers, {args.records:,} request records over a week, median of {args.runs}")
    baseline = pages[0].timings.p50
    print_baseline(pages[0].name, baseline, "ms", f"{pages[0].size / 1024:,.0f} KiB")
    for page in pages[1:]:
        print_figure(page.name, page.timings.p50, "ms", baseline, f"{page.size / 1024:,.0f} KiB")
