"""A server's known traffic for its page's tests: /metrics pulls stored by the scrape service, request
records by the ingest service, KV events by the KV-event writer; all rolled up as the task does."""

from datetime import datetime, timedelta

from django.utils import timezone

from app.fleet.models import Server
from app.rollups.refresh import refresh_minute_rollups
from app.rollups.servers import refresh_server_minutes
from app.traffic.models import KVEvent
from app.traffic.services.kv_events import KVEventRow, StreamPosition, store_kv_events
from app.traffic.services.requests import ingest_request_records
from app.traffic.services.scrapes import record_scrape
from collectors.metrics.parse import parse_metrics
from collectors.records import RequestFacts

LABELS = 'engine="0",model_name="tiny"'
SCRAPE_EVERY = timedelta(seconds=30)
SCRAPES = 25  # from two minutes before the start to ten minutes after


def metrics_page(n: int) -> str:
    """The n-th pull: per pull 100 queried tokens and 40 hits (a 40 % hit rate), 6 finished requests
    (0.2 a second), a preemption every other pull, KV usage 20 % and 40 % in turn."""
    return f"""# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{{LABELS}}} {100 * n}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{{LABELS}}} {40 * n}
# TYPE vllm:request_success counter
vllm:request_success_total{{{LABELS},finished_reason="stop"}} {6 * n}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{{LABELS}}} {n // 2}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{LABELS}}} {0.2 if n % 2 else 0.4}
"""


def a_served_server(name: str = "vllm-charted") -> tuple[Server, datetime]:
    """A server with ten minutes of pulls, requests and KV events; returns it and the first minute."""
    server = Server.objects.create(name=name, base_url=f"http://{name}:8000", block_size=16, model="tiny")
    now = timezone.now().replace(second=0, microsecond=0)
    start = now - timedelta(minutes=30)
    for n in range(SCRAPES):
        at = start - timedelta(minutes=2) + n * SCRAPE_EVERY
        record_scrape(
            server=server, scraped_at=at, samples=parse_metrics(metrics_page(n)), duration_seconds=0.01
        )
    facts = [
        RequestFacts(request_id=f"q{m}", arrived_at=start + timedelta(minutes=m, seconds=5), server=name,
                     prompt_tokens=1000, cached_tokens=100 * m, client_ttft_seconds=0.05 * (m + 1))
        for m in range(10)
    ]  # fmt: skip
    ingest_request_records(facts, source="rest", now=timezone.now())
    refresh_minute_rollups(since=start, until=start + timedelta(minutes=10))
    _blocks_that_lived(server, start, lifetimes=[30, 90])
    refresh_server_minutes(since=start - timedelta(minutes=5), until=timezone.now())
    return server, start


def _blocks_that_lived(server: Server, start: datetime, *, lifetimes: list[int]) -> None:
    """One block stored at `start` per lifetime, removed that many seconds later."""
    rows, seq = [], 0
    changes = [(start, KVEvent.Kind.STORED, h) for h in range(1, len(lifetimes) + 1)]
    changes += [(start + timedelta(seconds=s), KVEvent.Kind.REMOVED, h) for h, s in enumerate(lifetimes, 1)]
    for at, kind, block in sorted(changes):
        seq += 1
        rows.append(
            KVEventRow(
                server.pk,
                0,
                0,
                seq,
                0,
                0,
                at,
                at,
                int(kind),
                1000 + block,
                None,
                16 if kind == KVEvent.Kind.STORED else None,
                "GPU",
                "",
                None,
            )
        )
    store_kv_events(rows=rows, positions=[StreamPosition(server.pk, 0, 0, seq, rows[-1].emitted_at)])
