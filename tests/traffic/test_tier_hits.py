"""Hits by storage tier from the counters a server's /metrics pulls said, stored as scraped."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from app.dashboard.metrics.tiers import NEWEST_WITHIN
from app.fleet.models import Server
from app.traffic.services.scrapes import record_scrape
from app.traffic.tier_hits import tier_hits
from collectors.metrics.names import TIERS, offload_tier
from collectors.metrics.parse import parse_metrics
from tests.core.test_own_metrics import samples

pytestmark = pytest.mark.django_db

# vLLM 0.32's names and tier labels (vllm/v1/kv_offload/tiering/metrics.py: "0:primary" is the CPU
# tier, "<n>:<backend>" the ones below), and LMCache MP's per-level hit tokens with its labels.
PULL = """\
# TYPE vllm:kv_offload_tiering_chunk_queries counter
vllm:kv_offload_tiering_chunk_queries_total{{engine="0",model_name="tiny",tier="0:primary"}} {q}
vllm:kv_offload_tiering_chunk_queries_total{{engine="0",model_name="tiny",tier="1:fs"}} {q2}
# TYPE vllm:kv_offload_tiering_chunk_hits counter
vllm:kv_offload_tiering_chunk_hits_total{{engine="0",model_name="tiny",tier="0:primary"}} {h}
vllm:kv_offload_tiering_chunk_hits_total{{engine="0",model_name="tiny",tier="1:fs"}} {h2}
# TYPE lmcache_mp_lookup_hit_l1_tokens counter
lmcache_mp_lookup_hit_l1_tokens_total{{model_name="tiny",cache_salt="a"}} {l1}
lmcache_mp_lookup_hit_l1_tokens_total{{model_name="tiny",cache_salt="b"}} {l1}
# TYPE lmcache_mp_lookup_requested_tokens counter
lmcache_mp_lookup_requested_tokens_total{{model_name="tiny",cache_salt="a"}} {req}
"""


def test_each_lower_tiers_growth_is_read_per_source_in_a_bounded_tier() -> None:
    server = Server.objects.create(name="offloading", base_url="http://127.0.0.1:1")
    now = timezone.now()
    pulls = [dict(q=10, q2=4, h=5, h2=1, l1=100, req=400), dict(q=30, q2=4, h=20, h2=1, l1=160, req=1000)]
    for minutes, values in enumerate(pulls):
        record_scrape(server=server, scraped_at=now + timedelta(minutes=minutes),
                      samples=parse_metrics(PULL.format(**values)), duration_seconds=0.1)  # fmt: skip
    found = {(t.source, t.tier): (t.hits, t.queries, t.unit) for t in tier_hits(
        server_id=server.pk, since=now - timedelta(minutes=1), until=now + timedelta(minutes=5))}  # fmt: skip
    assert found == {
        ("vllm offloading", "cpu"): (15, 20, "blocks"),
        ("vllm offloading", "storage"): (0, 0, "blocks"),  # reported, idle: 0, not absent
        ("lmcache", "cpu"): (120, 600, "tokens"),  # two salts' series summed
    }


def test_a_server_without_lower_tiers_reports_none() -> None:
    server = Server.objects.create(name="plain", base_url="http://127.0.0.1:2")
    now = timezone.now()
    assert tier_hits(server_id=server.pk, since=now - timedelta(hours=1), until=now) == []


@pytest.mark.parametrize(
    ("label", "tier"),
    [
        ("0:primary", "cpu"),
        ("2:fs", "storage"),
        ("1:p2p", "remote"),
        ("3:My Backend!", "other"),
        (None, "other"),
    ],
)
def test_any_tier_label_maps_into_the_fixed_set(label: str | None, tier: str) -> None:
    assert offload_tier(label) == tier in TIERS


def test_metrics_export_each_servers_newest_tier_counters_under_bounded_tiers(client: Client) -> None:
    server = Server.objects.create(name="offloading", base_url="http://127.0.0.1:1", model="tiny")
    quiet = Server.objects.create(name="stale", base_url="http://127.0.0.1:3", model="tiny")
    now = timezone.now()
    pulls = [dict(q=10, q2=4, h=5, h2=1, l1=100, req=400), dict(q=30, q2=4, h=20, h2=1, l1=160, req=1000)]
    for minutes, pull in enumerate(pulls):
        record_scrape(server=server, scraped_at=now - timedelta(minutes=2 - minutes),
                      samples=parse_metrics(PULL.format(**pull)), duration_seconds=0.1)  # fmt: skip
    record_scrape(server=quiet, scraped_at=now - NEWEST_WITHIN - timedelta(minutes=1),
                  samples=parse_metrics(PULL.format(**pulls[0])), duration_seconds=0.1)  # fmt: skip
    exported = samples(client)

    def sample(name: str, tier: str, unit: str) -> float | None:
        key = (("model", "tiny"), ("server", "offloading"), ("tier", tier), ("unit", unit))
        return exported.get((f"prefixscope_server_tier_{name}_total", key))

    assert (sample("hits", "cpu", "blocks"), sample("queries", "cpu", "blocks")) == (20, 30)
    assert (sample("hits", "storage", "blocks"), sample("queries", "storage", "blocks")) == (1, 4)
    assert (sample("hits", "cpu", "tokens"), sample("queries", "cpu", "tokens")) == (320, 1000)
    tiered = [dict(k) for name, k in exported if name.startswith("prefixscope_server_tier_")]
    assert {labels["tier"] for labels in tiered} <= set(TIERS)
    assert all(labels["server"] == "offloading" for labels in tiered)  # not one scraped too long ago
