"""The side traffic of a scenario (simulator/scenario_side.py): parsed from the demo, planned apart
from the routed traffic, and refused with the bad field's path."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.planner import plan_requests, plan_side_requests
from simulator.scenario import ScenarioError, load_scenario, parse_scenario, resolve_scenario
from simulator.scenario_side import SIDE_FIELDS
from simulator.template_repo import create_repo

START = datetime(2026, 12, 6, tzinfo=UTC)


def demo() -> dict[str, Any]:
    with resolve_scenario("demo").open() as file:
        found: dict[str, Any] = yaml.safe_load(file)
    return found


def test_the_side_traffic_leaves_the_routed_plan_as_it_was(tmp_path: Path) -> None:
    with_sides = load_scenario(resolve_scenario("demo"))
    without = parse_scenario({k: v for k, v in demo().items() if k not in SIDE_FIELDS})
    commits = create_repo(tmp_path / "repo", with_sides, START)
    routed = [(r.request_id, r.server, r.body) for r in plan_requests(with_sides, commits, seed=3)]
    assert routed == [(r.request_id, r.server, r.body) for r in plan_requests(without, commits, seed=3)]
    side = plan_side_requests(with_sides, commits, seed=3)
    assert {r.server for r in side} == {4, 5, 6, 7, 8} and with_sides.server_count == 9
    assert [r.at for r in side] == sorted(r.at for r in side)
    chat = [r for r in side if r.template == "parcel-desk"]
    assert len(chat) == 3 * 7 and {r.server for r in chat} == {7}
    assert chat[-1].body["model"] == "support-lora"
    tools = [r.body["tools"] for r in chat]
    assert isinstance(tools[0], list) and tools[3] == tools[0][::-1]  # the tools phase reordered them
    assert not set(r.request_id for r in side) & set(r[0] for r in routed)


CHAT = demo()["conversations"][0]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"conversations": [{**CHAT, "side_server": 9}]}, "conversations[0].side_server"),
        ({"conversations": [{**CHAT, "side_server": 0}]}, "conversations[0].adapter"),
        ({"conversations": [{**CHAT, "changes": ["tone"]}]}, "conversations[0].changes[0]"),
        ({"side_servers": [{"rate": 0.1, "hybrid_block": 20}]}, "side_servers[0].hybrid_block"),
        ({"side_servers": [{"cpu_tier": {"num_blocks": 8, "reload": 1}}]}, "side_servers[0].cpu_tier.reload"),
        ({"hosted": {"sessions": 0}}, "hosted.sessions"),
        ({"side_servers": [{"undecodable_kv_events": {"at": 60, "batches": 0}}]},
         "side_servers[0].undecodable_kv_events.batches"),
        ({"side_servers": [{"undecodable_kv_events": {"batches": 2}}]},
         "side_servers[0].undecodable_kv_events.at"),
        ({"side_servers": [{"gateway_bypass_from": -1}]}, "side_servers[0].gateway_bypass_from"),
    ],
)  # fmt: skip
def test_bad_side_traffic_names_its_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(demo() | change)
    assert error.value.field == field


def test_the_demos_collection_faults_come_after_what_they_need(tmp_path: Path) -> None:
    """sim-8's clients send through the gateway before they bypass it (RequestRecordsStopped needs a
    source that sent once), and sim-4's undecodable batches come after the 15 minutes a Prometheus
    started with the demo needs before KVEventsUndecodable can read a new series as new."""
    scenario = load_scenario(resolve_scenario("demo"))
    bypassing = [side for side in scenario.side_servers if side.gateway_bypass_from is not None]
    undecodable = [side.undecodable_events for side in scenario.side_servers if side.undecodable_events]
    assert [side.server for side in bypassing] == [8] and [e.server for e in undecodable] == [4]
    commits = create_repo(tmp_path / "repo", scenario, START)
    before = [r for r in plan_side_requests(scenario, commits, seed=0) if r.server == 8]
    assert before and before[0].at < (bypassing[0].gateway_bypass_from or 0)
    assert 15 * 60 < undecodable[0].at < scenario.duration
