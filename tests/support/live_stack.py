"""A running stack for Prometheus to scrape: one simulated vLLM server that has served the captured
traffic (evictions included), and the rows that give every family of Prefixscope's /metrics a
sample, as its collectors and analysis would have written them about that server.

Rows are written directly, as tests/core/test_own_metrics.py writes them: what matters here is that
each family has samples, with the label values the alert rules select (open regressions of a template
and of a server's capacity, request and diagnosis rollups today and in the baseline hours, a server
of known KV size and group, a template of a repository, a gateway and a KV subscriber...).
"""

from datetime import UTC, datetime, timedelta

import httpx

from app.fleet.models import Server
from app.prompts.models import CacheKiller, Template, TemplateRepository, TemplateVersion, VersionCheck
from app.regressions.models import Regression
from app.traffic.collection.processes import LeaseCounts, report_collector_process
from app.traffic.models import (
    HourRollup,
    KVGap,
    KVStream,
    LossHour,
    LossMinute,
    MinuteRollup,
    RecordsReceived,
    RejectedInput,
    TenantSalt,
)
from app.traffic.services.scrapes import record_scrape
from collectors.metrics.parse import parse_metrics
from simulator.server import ServerConfig
from tests.support.captures import captured_traffic

# Cumulative per bound of app/domain/histogram.py's TTFT_BUCKETS_SECONDS, then the total.
TTFT_BUCKETS = [0] * 7 + [2, 2, 3] + [3] * 12 + [4]


def serve_captured_traffic(config: ServerConfig) -> None:
    """Send the captured requests to the simulated server: its counters and histograms move, and its
    small cache evicts (vllm:kv_block_lifetime_seconds observes evictions)."""
    for body, _ in captured_traffic():
        if not body.get("stream"):
            answer = httpx.post(config.base_url + "/v1/completions", json=body, timeout=30)
            answer.raise_for_status()


def store_every_family(config: ServerConfig, now: datetime) -> None:
    """Rows about the simulated server that give each family of Prefixscope's /metrics a sample."""
    server = Server.objects.create(
        name=config.name,
        base_url=config.base_url,
        model=config.model,
        block_size=config.block_size,
        hash_algo="sha256_cbor",
        kv_events_endpoint=f"tcp://{config.host}:{config.kv_port}",
        last_scraped_at=now,
        scrape_interval_seconds=30,
        num_gpu_blocks=config.num_blocks,
        group="gpu-eu",
    )
    repository = TemplateRepository.objects.create(
        name="demo-templates", location="/srv/templates/demo", globs=["templates/*.j2"]
    )
    template = Template.objects.create(name="support", repository=repository, path="templates/support.j2")
    _store_traffic(server, template, now)
    _store_collection(server, now)
    _store_findings(server, template, now)


def _store_traffic(server: Server, template: Template, now: datetime) -> None:
    """Requests and their diagnoses, by the hour (today's counters, and the baseline hours) and by
    the minute (progress)."""
    hour = max(now.replace(minute=0, second=0, microsecond=0), _midnight(now))
    minute = now.replace(second=0, microsecond=0)
    version = TemplateVersion.objects.create(
        template=template, commit_sha="a" * 40, committed_at=now, first_seen_at=now
    )
    # Its check at import predicted it to break the cache (4 reusable blocks to 0).
    VersionCheck.objects.create(
        version=version, checked_at=now, verdict="failed", base_blocks=4, head_blocks=0
    )
    for at_template in (template, None):
        LossHour.objects.create(
            server=server,
            template=at_template,
            template_version=version if at_template else None,
            tenant="acme" if at_template else "",
            hour=hour,
            requests=10,
            diagnosed=10,
            prompt_tokens=1000,
            diagnosed_prompt_tokens=1000,
            seen_before_tokens=900,
            reused_tokens=600,
            evicted_tokens=200,
            salt_tokens=100,
        )
        HourRollup.objects.create(
            server=server,
            template=at_template,
            hour=hour,
            requests=4,
            prompt_tokens=400,
            cached_tokens=0,
            client_ttft_count=4,
            client_ttft_sum_seconds=3.0,
            client_ttft_buckets=TTFT_BUCKETS,
            server_ttft_count=4,
            server_ttft_sum_seconds=1.0,
            server_ttft_buckets=TTFT_BUCKETS,
        )
    MinuteRollup.objects.create(server=server, minute=minute, requests=1, prompt_tokens=1, cached_tokens=0)
    LossMinute.objects.create(
        server=server, template=template, minute=minute, requests=1, diagnosed=1, evicted_tokens=16
    )
    _store_baseline(server, version, now)
    TenantSalt.objects.create(tenant="acme", salt_hash="ab" * 32, first_seen_at=now, last_seen_at=now)


def _store_baseline(server: Server, version: TemplateVersion, now: datetime) -> None:
    """The hours 2 to 5 before now, inside the six baseline hours of the hit-rate alerts whatever the
    minute: 80000 diagnosed prompt tokens of the template and tenant, over the alerts' floor."""
    for hours_before in range(2, 6):
        LossHour.objects.create(
            server=server,
            template=version.template,
            template_version=version,
            tenant="acme",
            hour=now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours_before),
            requests=100,
            diagnosed=100,
            prompt_tokens=20000,
            diagnosed_prompt_tokens=20000,
            seen_before_tokens=18000,
            reused_tokens=16000,
            evicted_tokens=2000,
        )


def _store_collection(server: Server, now: datetime) -> None:
    """KV streams and their gaps, rejected input, and a gateway and a KV subscriber reporting."""
    KVStream.objects.create(
        server=server,
        dp_rank=0,
        epoch=1,
        last_seq=40,
        last_event_at=now,
        blocks_stored=500,
        blocks_removed=200,
        blocks_thrashed=30,
    )
    KVGap.objects.create(
        server=server, epoch=1, first_seq=5, last_seq=9, recovered=3, lost=2, detected_at=now
    )
    RejectedInput.objects.create(
        server=server,
        source="kv_events",
        reason="kv_not_msgpack",
        count=3,
        first_seen_at=now,
        last_seen_at=now,
    )
    RejectedInput.objects.create(
        server=server, source="otlp", reason="field_invalid", count=12, first_seen_at=now, last_seen_at=now
    )
    # A lower tier of the offloading connector, under a backend name of its own: exported as a tier.
    record_scrape(server=server, scraped_at=now, duration_seconds=0.1, samples=parse_metrics(
        'vllm:kv_offload_tiering_chunk_hits_total{engine="0",tier="0:primary"} 7\n'
        'vllm:kv_offload_tiering_chunk_queries_total{engine="0",tier="3:someones-store"} 9\n'))  # fmt: skip
    RecordsReceived.objects.create(
        server=server, source="gateway", count=40, first_received_at=now, last_received_at=now
    )
    report_collector_process(
        kind="gateway", name=server.name, process="gw:1", queue_depth=2, spill_bytes=4096, now=now
    )
    report_collector_process(
        kind="kv_subscriber",
        name="collectors-1",
        process="c:1",
        queue_depth=30,
        now=now,
        leases=LeaseCounts(held=1, taken=2, lost=1, released=1),
    )


def _store_findings(server: Server, template: Template, now: datetime) -> None:
    """Open regressions (the template's prompt change, the server's capacity) and a cache killer of
    the template."""
    for scope, kind, at_template, at_server in (
        (Regression.Scope.TEMPLATE, Regression.Kind.TEMPLATE_COMMIT, template, None),
        (Regression.Scope.SERVER, Regression.Kind.CAPACITY, None, server),
    ):
        Regression.objects.create(
            scope=scope,
            kind=kind,
            template=at_template,
            server=at_server,
            changed_at=now - timedelta(minutes=20),
            detected_at=now,
            updated_at=now,
            rate_before=0.8,
            rate_after=0.2,
            rate_now=0.2,
            requests_before=300,
            requests_after=200,
            confidence=0.999,
            state=Regression.State.OPEN,
        )
    CacheKiller.objects.create(
        template=template,
        block_size=server.block_size or 16,
        computed_at=now,
        window_start=now - timedelta(hours=1),
        window_end=now,
        mode="tokens",
        position_token=48,
        block_index=3,
        kind="timestamp",
        requests=100,
        requests_affected=90,
        continuations=100,
        tokens_lost=9000,
    )


def _midnight(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
