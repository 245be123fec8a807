"""A server's effective block, from what its /metrics states and the KV-cache groups its events name."""

from datetime import UTC, datetime

import pytest

from app.domain.hitblock import HitBlock
from app.fleet.models import Server
from app.fleet.services import KVCacheGroups, record_kv_cache_groups, record_scrape_outcome
from collectors.metrics.parse import cache_config, parse_metrics
from tests.support.captures import VLLM_CPU_FIXTURES

pytestmark = pytest.mark.django_db
PAGE = (VLLM_CPU_FIXTURES / "metrics-after.txt").read_text()
AT = datetime(2026, 12, 1, tzinfo=UTC)


def scraped(page: str) -> Server:
    server = Server.objects.create(name="vllm", base_url="http://vllm:8000")
    record_scrape_outcome(server=server, at=AT, ok=True, config=cache_config(parse_metrics(page)))
    return Server.objects.get(pk=server.pk)


def test_the_captured_plain_server_hits_at_its_block_size() -> None:
    server = scraped(PAGE)
    assert server.hit_block == HitBlock(32, 32, drops_last=False)
    assert server.hit_block.plain


def test_a_hybrid_pages_mamba_block_and_speculative_decoding_set_the_effective_block() -> None:
    page = PAGE.replace('mamba_block_size="None"', 'mamba_block_size="3584"')
    page += "# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total 0.0\n"
    server = scraped(page)
    assert (server.stated_hit_block, server.drops_last_block) == (3584, True)
    assert server.hit_block == HitBlock(32, 3584, drops_last=True)


def test_the_kv_cache_groups_its_events_name_set_the_effective_block() -> None:
    server = scraped(PAGE)
    groups: KVCacheGroups = {
        "0": {"kind": "full_attention", "block_size": 32},
        "1": {"kind": "mamba", "block_size": 512},
    }
    record_kv_cache_groups(server_id=server.pk, groups=groups)
    server.refresh_from_db()
    assert server.hit_block == HitBlock(32, 512)
