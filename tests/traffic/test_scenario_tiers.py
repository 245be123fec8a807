"""Demoted against evicted, through the real path: a simulated server with a CPU offload tier
(simulator/offload.py) whose lookups fail, so the engine recomputes what the tier holds. The KV
events of both tiers go through `collect_kv_events`, the requests through the gateway, then the
diagnosis.

What each request lost to the cache (read from the token ids alone, tests/traffic/
test_scenario_causes.py lost_most_to) was injected as `demoted` when the tier kept every block it
was given, and as `evicted` when it holds one block only (what the GPU dropped is gone). The
confusion table is printed; each must be right for at least ACCURACY of the requests it hit.
"""

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from app.traffic.models import KVEvent
from simulator.server import ServerConfig
from tests.traffic.test_scenario_causes import ACCURACY, lost_most_to, run_scenario, scenario

pytestmark = pytest.mark.django_db(transaction=True)

SMALL_GPU = {"count": 1, "block_size": 16, "num_blocks": 64}  # about two prompts
TIERS = {
    "demoted": 100_000,  # CPU blocks: the tier keeps all the GPU drops (its lookups fail)
    "evicted": 1,  # the tier keeps one block: the rest is gone
}


@pytest.mark.parametrize("injected", list(TIERS))
def test_blocks_a_lower_tier_kept_are_demoted_and_the_others_evicted(injected: str, tmp_path: Path) -> None:
    def with_tier(configs: list[ServerConfig]) -> list[ServerConfig]:
        return [replace(c, cpu_blocks=TIERS[injected], cpu_reload=False) for c in configs]

    ran = run_scenario(scenario(servers=SMALL_GPU), tmp_path, configure=with_tier)
    assert KVEvent.objects.filter(medium="CPU").exists(), "the tier published nothing"
    hit = [r for r, cause in lost_most_to(ran.requests).items() if cause == "cache"]
    found = {r.request_id: r.cause for r in ran.requests}
    table = Counter((injected, found[r]) for r in hit)
    print(f"\n{injected}: {len(hit)} requests lost to the cache of {len(ran.requests)}: {dict(table)}")  # noqa: T201
    assert len(hit) >= 3, f"too few requests lost to the cache to judge: {len(hit)}"
    assert table[injected, injected] / len(hit) >= ACCURACY, dict(table)
