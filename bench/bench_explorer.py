"""How long the requests explorer takes over many request records: its first page and a deep page.

    DATABASE_URL=postgres://... .venv/bin/python -m bench explorer [--records 1000000] [--runs 5]

Runs in a throw-away database (bench_explorer, created and dropped on the server DATABASE_URL names).
The records (counts and timings, no token ids) arrive through the real ingest over the last three
days, on 20 servers, 8 templates and 4 tenants, then the tables are analysed. Each figure is the
median over the runs of one request through Django's whole stack, in this process: the page, and
the API's JSON, first page and the page reached by following `next` 20 times. No diagnoses are
stored, so a cause filter finds nothing and reads its whole window: its figure is the worst case
(and its "page 21" is its first and only page). Each is printed with its ratio to GET /healthz in the
same run (the stack's floor). Then the selector alone reads pages 21 and 201 after their cursors,
against the same rows by OFFSET, the baseline keyset pagination replaces.
"""

import argparse
import time
from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from urllib.parse import parse_qsl, urlencode

from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from app.domain.keyset import Cursor
from app.fleet.models import Server
from app.traffic.explorer import (
    PAGE_SIZE,
    RequestFilterForm,
    RequestFilters,
    explore_requests,
    matching_requests,
)
from app.traffic.models import RequestRecord
from app.traffic.services.requests import ingest_request_records
from bench import harness
from bench.harness import print_baseline, print_figure, throwaway_database, time_pages
from collectors.records import RequestFacts

VIEWS = {
    "no filter": {},
    "server": {"server": "vllm-7"},
    "template": {"template": "tpl-3"},
    "tenant + hit 0-20 %": {"tenant": "t2", "hit_max": "20"},
    "server + tenant + missed (worst: no diagnoses)": {"server": "vllm-7", "tenant": "t2", "missed": "on"},
}


def load(records: int) -> float:
    """Ingest the records; the seconds it took."""
    now = timezone.now()
    for n in range(20):
        Server.objects.create(name=f"vllm-{n}", base_url=f"http://127.0.0.1:9/{n}", block_size=16)
    step = timedelta(days=3) / records
    started = time.perf_counter()
    for first in range(0, records, 10_000):
        batch = [
            RequestFacts(
                request_id=f"r-{n}", arrived_at=now - timedelta(days=3) + n * step, server=f"vllm-{n % 20}",
                model="m", tenant=f"t{n % 4}", template=f"tpl-{n % 8}", prompt_tokens=1_000 + n % 997,
                cached_tokens=(n * 7) % 1_000, client_ttft_seconds=0.2, server_ttft_seconds=0.1,
            )
            for n in range(first, min(first + 10_000, records))
        ]  # fmt: skip
        ingest_request_records(batch, source="rest", now=now)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE traffic_requestrecord")
    return time.perf_counter() - started


def deep(client: Client, url: str, query: str, pages: int) -> str:
    """The URL of the page `pages` pages after the first by the API's `next` links (or of the last)."""
    reached = f"{url}{query}"
    for _ in range(pages):
        following = client.get(reached).json()["next"]
        if following is None:
            break
        reached = following
    return reached


def keyset_against_offset(query: dict[str, str], runs: int) -> list[float]:
    """Reading page 21 and page 201 (50 rows each) by cursor and by OFFSET, through the selector;
    NaN for a page the filters do not reach."""
    form = RequestFilterForm(query)
    assert form.is_valid(), form.errors
    filters = form.filters(now=timezone.now())
    cursors: dict[int, Cursor] = {}
    after: Cursor | None = None
    for number in range(2, 202):
        after = explore_requests(filters, after=after).next
        if after is None:
            break
        cursors[number] = after
    figures = []
    for number in (21, 201):
        if number not in cursors:
            figures += [float("nan"), float("nan")]
            continue
        figures.append(harness.median_ms(runs, partial(_keyset_page, filters, cursors[number])))
        figures.append(harness.median_ms(runs, partial(_offset_page, filters, (number - 1) * PAGE_SIZE)))
    return figures


def _keyset_page(filters: RequestFilters, after: Cursor) -> list[RequestRecord]:
    return list(matching_requests(filters, after=after)[: PAGE_SIZE + 1])


def _offset_page(filters: RequestFilters, offset: int) -> list[RequestRecord]:
    return list(matching_requests(filters, after=None)[offset : offset + PAGE_SIZE + 1])


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    rows, deep_rows = [], []
    with throwaway_database("bench_explorer"):
        load_seconds = load(args.records)
        client = Client()
        client.force_login(User.objects.create_superuser("bench"))  # sees every tenant's rows
        floor = time_pages(client, {"GET /healthz": "/healthz"}, args.runs)[0].timings.p50
        for name, params in VIEWS.items():
            query = f"?{urlencode({'window': '7d', **params})}"
            urls = {"page": f"/requests/{query}", "API p1": f"/api/v1/requests{query}",
                    "API p21": deep(client, "/api/v1/requests", query, 20)}  # fmt: skip
            rows.append((name, time_pages(client, urls, args.runs)))
            deep_rows.append((name, keyset_against_offset(dict(parse_qsl(query[1:])), args.runs)))
    print(f"{args.records:,} request records over 3 days, ingested in {load_seconds:,.0f} s")
    print(f"median of {args.runs} runs; 50 rows a page; the pages against GET /healthz, the stack's floor")
    print_baseline("GET /healthz", floor, "ms")
    for name, pages in rows:
        for page in pages:
            print_figure(f"{name}: {page.name}", page.timings.p50, "ms", floor)
    print("\nthe selector alone, keyset (after a cursor) against OFFSET (the baseline), same page")
    for name, (key21, offset21, key201, offset201) in deep_rows:
        print_figure(f"{name}: keyset p21", key21, "ms", offset21, f"OFFSET {offset21:.1f} ms")
        print_figure(f"{name}: keyset p201", key201, "ms", offset201, f"OFFSET {offset201:.1f} ms")
