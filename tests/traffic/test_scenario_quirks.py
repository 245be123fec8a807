"""The engine quirks of simulator/scenarios/effective-block.yaml through the real path (the fleet
behind `manage.py gateway`, its KV events collected, its /metrics scraped), then diagnosed: a hybrid
server's prompts below its effective block are below_block, not misses; a server whose hit counter is
not wired has its requests in that state, not as misses; the plain server keeps its causes.

What each request was injected with is read from the scenario and the token ids, not from the
diagnosis: the confusion table (injected -> found) is printed."""

from collections import Counter
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.domain.replay.calibration import Trust
from app.fleet.models import Server
from app.traffic.models import KVStream
from app.whatif.services import Scope, ScopeKind, ask
from simulator.fleet import with_quirks
from simulator.scenario import load_scenario, resolve_scenario
from simulator.server import ServerConfig
from tests.traffic.test_scenario_causes import ACCURACY, Ran, Request, run_scenario

pytestmark = pytest.mark.django_db(transaction=True)
HYBRID, UNWIRED = "sim-0", "sim-1"


def quirky(configs: list[ServerConfig]) -> list[ServerConfig]:
    """The scenario's quirks; every server models its TTFT for real (prefill at 4,000 tokens/s, no
    decode time), so the gateway sees what reuse saves, and what it does not: the hybrid server's
    prompts below its effective block are prefilled whole, first sighting or repeat, so a loaded
    machine's noise cannot read as its repeats getting faster."""
    loaded = load_scenario(resolve_scenario("effective-block"))
    made = with_quirks(configs, loaded.servers.quirks)
    return [
        replace(c, sleep=True, prefill_tokens_per_second=4000.0, decode_seconds_per_token=0.0) for c in made
    ]


def injected(requests: list[Request]) -> dict[str, str]:
    """Per request of a quirky server: on the unwired one, every request; on the hybrid one, a
    request whose leading blocks an earlier prompt of its salt on that server shared (a plain server
    would have hit) and whose prompt is below the effective block (it could not)."""
    found: dict[str, str] = {}
    for index, r in enumerate(requests):
        if r.server == UNWIRED:
            found[r.request_id] = "counter_not_wired"
        elif r.server == HYBRID and len(r.token_ids) <= 512:
            earlier = [e for e in requests[:index] if e.server == HYBRID and e.salt == r.salt]
            if any(e.token_ids[:16] == r.token_ids[:16] for e in earlier):
                found[r.request_id] = "below_block"
    return found


def test_quirky_servers_requests_are_not_called_misses_nor_replayed_as_plain(tmp_path: Path) -> None:
    with resolve_scenario("effective-block").open() as file:
        definition: dict[str, Any] = yaml.safe_load(file)
    ran = run_scenario(definition, tmp_path, configure=quirky)
    hybrid = Server.objects.get(name=HYBRID)
    assert hybrid.hit_block is not None and hybrid.hit_block.effective == 512
    # Its attention group is its events' group 1 (the Mamba group is 0), learned from their kinds;
    # its block index follows it (with group 0 taken, it would hold none of its prompts' blocks).
    assert hybrid.attention_group == 1 and hybrid.kv_cache_groups["1"]["kind"] == "full_attention"
    assert KVStream.objects.filter(server=hybrid, resident_blocks__gt=0).exists()
    expected = injected(ran.requests)
    found = {r.request_id: r.cause for r in ran.requests}
    table = Counter((cause, found[request_id]) for request_id, cause in expected.items())
    plain = Counter(r.cause for r in ran.requests if r.server not in (HYBRID, UNWIRED))
    print(f"\ninjected -> found: {dict(table)}; plain server: {dict(plain)}")  # noqa: T201
    for cause in ("below_block", "counter_not_wired"):
        hit = sum(n for (c, _), n in table.items() if c == cause)
        right = table[(cause, cause)]
        assert hit >= 3 and right / hit >= ACCURACY, (cause, dict(table))
    assert "counter_not_wired" not in plain and "unexplained" not in plain
    assert_replay_calibrates(ran)


def assert_replay_calibrates(ran: Ran) -> None:
    """The fleet's what-if over the run replays each request as its engine reused it: the hybrid
    server's hits rounded to its effective block, the others' plain; the unwired server's reports
    (none of its reuse) left out of the comparison, and named."""
    since = min(r.arrived_at for r in ran.requests).replace(microsecond=0)
    until = max(r.arrived_at for r in ran.requests) + timedelta(seconds=1)
    calibration = ask(scope=Scope(ScopeKind.FLEET), since=since, until=until).answers.calibration
    compared = [r for r in ran.requests if r.server != UNWIRED]
    assert calibration.uncompared == (UNWIRED,)
    assert calibration.requests == len(compared)
    assert calibration.reported_tokens == sum(r.cached_tokens for r in compared)
    assert calibration.trust is Trust.GOOD, calibration
    assert calibration.exact_share is not None and calibration.exact_share >= ACCURACY, calibration
