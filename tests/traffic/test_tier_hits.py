"""Hits by storage tier from the counters a server's /metrics pulls said, stored as scraped."""

from datetime import timedelta

import pytest
from django.utils import timezone

from app.fleet.models import Server
from app.traffic.services.scrapes import record_scrape
from app.traffic.tier_hits import tier_hits
from collectors.metrics.names import TIERS, offload_tier
from collectors.metrics.parse import parse_metrics

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
