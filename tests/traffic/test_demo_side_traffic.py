"""The demo scenario's side traffic (simulator/scenarios/demo.yaml after `timeline`) through the real
path, as `make run` sends it: the side servers and the conversation behind `manage.py gateway`, their
KV events collected, their /metrics scraped; the application's hosted-API usage sent by the load
generator's own reporter to a live Prefixscope's REST ingest and OTLP endpoint. Each new cause and
state of issue 27 must be found at least once, on the server or session that injects it."""

import asyncio
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from django.test import override_settings
from django.utils import timezone
from pytest_django.live_server_helper import LiveServer

from app.api.services import create_ingest_token
from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.traffic.models import KVEvent, RequestDiagnosis
from simulator.fleet import with_sides
from simulator.hosted import demo_traffic
from simulator.hosted_report import report_hosted
from simulator.scenario import load_scenario, resolve_scenario
from simulator.server import ServerConfig
from tests.traffic.test_scenario_causes import run_scenario

pytestmark = pytest.mark.django_db(transaction=True)

SIDE_RATE = 0.3  # the side servers' requests a second: enough repeats and first sightings in 4 minutes


def demo_side_traffic() -> dict[str, Any]:
    """demo.yaml's side servers and conversation, with one routed server of little traffic, no
    timeline, and the side servers busier (a test has minutes of virtual time, not the demo's 25)."""
    with resolve_scenario("demo").open() as file:
        demo: dict[str, Any] = yaml.safe_load(file)
    sides = [side | {"rate": SIDE_RATE} if side.get("rate") else side for side in demo["side_servers"]]
    last = max(
        c["start"] + c["every"] * c["per_phase"] * (len(c["changes"]) + 1) for c in demo["conversations"]
    )
    # The undecodable batches within these minutes (tests/traffic/test_demo_collection_faults.py
    # checks what they do); sim-8's bypass goes nowhere else here (no gateway of its own to bypass).
    sides = [side | {"undecodable_kv_events": {"at": 30, "batches": 3}} if "undecodable_kv_events" in side
             else side for side in sides]  # fmt: skip
    return demo | {
        "duration": last + 10, "rate": 0.05, "timeline": [], "side_servers": sides,
        "servers": {**demo["servers"], "count": 1}, "hosted": None,
    }  # fmt: skip


def test_the_demos_side_servers_and_conversation_show_each_new_cause(tmp_path: Path) -> None:
    definition = demo_side_traffic()
    path = tmp_path / "side.yaml"
    path.write_text(yaml.safe_dump(definition))
    loaded = load_scenario(path)

    def as_the_demo(configs: list[ServerConfig]) -> list[ServerConfig]:
        # The unwired server sleeps out its modelled prefill (its reuse shows in TTFT only); the
        # fleet's spans, which carry vLLM's own TTFT in the demo, are not exported here.
        made = with_sides(configs, loaded.side_servers)
        return [
            c if c.hit_counter_wired else replace(c, sleep=True, decode_seconds_per_token=0.0) for c in made
        ]

    ran = run_scenario(definition, tmp_path, configure=as_the_demo)
    name = {side.server: f"sim-{side.server}" for side in loaded.side_servers}
    offload, hybrid, unwired, adapter, _bypassed = (name[side.server] for side in loaded.side_servers)
    causes = Counter((r.server, r.cause) for r in ran.requests)
    diagnoses = RequestDiagnosis.objects.filter(cause="prompt_changed").exclude(changed_part="")
    parts = Counter(diagnoses.values_list("changed_part", flat=True))
    print(f"\ncauses by server: {dict(causes)}\nchanged parts: {dict(parts)}")  # noqa: T201
    assert KVEvent.objects.filter(medium="CPU").exists(), "the CPU tier published nothing"
    assert causes[offload, "demoted"] >= 1
    assert causes[hybrid, "below_block"] >= 1
    assert causes[unwired, "counter_not_wired"] >= 1
    assert sum(n for (_, cause), n in causes.items() if cause == "new_content") >= 1
    assert {"tools", "reasoning_effort", "system", "history", "adapter"} <= set(parts), dict(parts)
    assert all(r.server == adapter for r in ran.requests if r.template == "parcel-desk")


def test_the_demos_hosted_usage_reaches_prefixscope_and_shows_each_hosted_cause(
    live_server: LiveServer,
) -> None:
    hosted = load_scenario(resolve_scenario("demo")).hosted
    assert hosted is not None and hosted.part_changes
    start = timezone.now() - timedelta(hours=1)
    requests = demo_traffic(hosted, start=start)
    token = create_ingest_token(name="demo-application")

    async def report() -> int:
        async def at_once(_: float) -> None:
            return None

        async with aiohttp.ClientSession() as session:
            return await report_hosted(
                session, requests, web_url=live_server.url, token=token, start=start, wait_until=at_once
            )

    assert asyncio.run(report()) == 0
    forget_kept_replay()
    with override_settings(PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS=0, PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES=180):
        diagnose_requests(now=timezone.now())
    found = Counter(d.cause or d.unknown for d in RequestDiagnosis.objects.all())
    print(f"\nhosted causes: {dict(found)}")  # noqa: T201
    wanted = ("below_minimum", "ttl_lapsed", "marker_absent", "cache_key_changed", "beyond_lookback")
    assert all(found[cause] >= 1 for cause in (*wanted, "gateway_cache")), dict(found)
    # The part-change conversation, over REST (its body) and as spans (their content): each change
    # named by its part, from each of the two sources.
    parts = Counter(RequestDiagnosis.objects.exclude(changed_part="").values_list("changed_part", flat=True))
    assert {part: n for part, n in parts.items() if n >= 2} == {"tools": 4, "system": 2, "history": 2}, parts
