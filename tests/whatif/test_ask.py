"""A what-if asked of stored records: the demo scenario's traffic stored as a deployment stores it
(tests/support/virtual_fleet.py), replayed, calibrated against what the simulated engines reused."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.domain.replay.calibration import Trust
from app.whatif.services import NothingToReplay, Scope, ScopeKind, ask
from simulator.scenario import resolve_scenario
from tests.support.virtual_fleet import run_virtually

pytestmark = pytest.mark.django_db(transaction=True)


def demo(duration: int, timeline: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    with resolve_scenario("demo").open() as file:
        found: dict[str, Any] = yaml.safe_load(file)
    found["duration"] = duration
    found["timeline"] = [e for e in found["timeline"] if e["at"] <= 0] + (timeline or [])
    return found


def test_the_fleet_as_it_was_replays_what_its_engines_reused(tmp_path: Path) -> None:
    run = run_virtually(demo(300), tmp_path, scrape_every=15)

    asked = ask(scope=Scope(ScopeKind.FLEET), since=run.at(0), until=run.at(301))

    calibration = asked.answers.calibration
    assert calibration.requests == len(run.planned)
    assert calibration.trust is Trust.GOOD, calibration
    assert calibration.exact_share is not None and calibration.exact_share > 0.95
    assert [s.num_blocks for s in asked.answers.servers] == [256] * 4


def test_a_capacity_cut_is_answered_with_its_restoring(tmp_path: Path) -> None:
    cut = [{"at": 60, "capacity_cut": {"server": 3, "num_blocks": 28}}]
    run = run_virtually(demo(360, cut), tmp_path, scrape_every=15)

    asked = ask(scope=Scope(ScopeKind.FLEET), since=run.at(75), until=run.at(361))

    # Replayed from the warm-up before the window: 256 blocks, then the cut's restart with 28.
    assert asked.answers.servers[3].num_blocks == 256
    [restart] = asked.answers.restarts
    assert (restart.server, restart.num_blocks) == ("virtual-3", 28)
    # Seen at the new epoch's first event: the first request the cut server served after it.
    first_after = min(r.at for r in run.planned if r.server == 3 and r.at >= 60)
    assert restart.at == pytest.approx(run.at(first_after).timestamp(), abs=0.01)
    [restored] = asked.answers.restored
    assert restored.label == "restore virtual-3 to 256 blocks"
    assert restored.saved_tokens_per_hour > 0
    assert asked.answers.calibration.trust is Trust.GOOD


def test_a_template_scope_counts_its_own_requests(tmp_path: Path) -> None:
    run = run_virtually(demo(240), tmp_path, scrape_every=15)

    asked = ask(scope=Scope(ScopeKind.TEMPLATE, "support"), since=run.at(0), until=run.at(241))

    assert asked.answers.requests == sum(1 for r in run.planned if r.template == "support")
    with pytest.raises(NothingToReplay):
        ask(scope=Scope(ScopeKind.TEMPLATE, "nobody"), since=run.at(0), until=run.at(241))


def test_servers_of_unknown_capacity_are_named_not_guessed(tmp_path: Path) -> None:
    run = run_virtually(demo(120), tmp_path)  # no /metrics pulled: no cache_config_info

    with pytest.raises(
        NothingToReplay, match="KV blocks unknown: virtual-0, virtual-1, virtual-2, virtual-3"
    ):
        ask(scope=Scope(ScopeKind.FLEET), since=run.at(0), until=run.at(121))
