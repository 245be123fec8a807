"""Miss causes of real traffic: the simulated fleet serves it, its KV events are collected over ZMQ as
in production, and every request's cause is checked against what the test made happen to it."""

import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import zmq
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.fleet.services import register_server
from app.rollups.refresh import refresh_loss_minutes
from app.traffic.collection.kv_collector import KVEventCollector
from app.traffic.models import KVEvent, LossMinute, RequestDiagnosis
from app.traffic.services.requests import ingest_request_records
from app.traffic.tasks import scrape_server
from collectors.parts import PartDigests
from collectors.records import RequestFacts
from simulator.fleet import describe
from tests.support.probes import Handshakes
from tests.support.processes import wait_until
from tests.support.published import all_stored
from tests.support.simulated_fleet import local_config, running_fleet
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db

rng = random.Random(11)
SYSTEM = [rng.randrange(1, 50_000) for _ in range(160)]  # five blocks of 32


def prompt(seed: int, *, changed_at: int | None = None) -> list[int]:
    own = random.Random(seed)
    tokens = SYSTEM + [own.randrange(1, 50_000) for _ in range(40)]
    if changed_at is not None:
        tokens[changed_at] = 50_001 + seed
    return tokens


class Fleet:
    """Two simulated servers (`a` small enough to evict), their KV events collected."""

    def __init__(self, servers: list[Server], collector: KVEventCollector) -> None:
        self.servers, self.collector = servers, collector
        self.sent = 0

    def send(
        self,
        server: int,
        tokens: list[int],
        *,
        salt: str | None = None,
        template: str = "support",
        tenant: str = "",
        parts: PartDigests | None = None,
    ) -> str:
        target = self.servers[server]
        body: dict[str, object] = {"model": target.model, "prompt": tokens, "max_tokens": 2}
        if salt:
            body["cache_salt"] = salt
        arrived_at = timezone.now()
        usage = httpx.post(target.base_url + "/v1/completions", json=body, timeout=10).json()["usage"]
        self.sent += 1
        request_id = f"req-{self.sent}"
        ingest_request_records(
            [
                RequestFacts(
                    request_id=request_id,
                    arrived_at=arrived_at,
                    server=target.name,
                    model=target.model,
                    template=template,
                    prompt_tokens=usage["prompt_tokens"],
                    cached_tokens=usage["prompt_tokens_details"]["cached_tokens"],
                    cache_salt=salt,
                    prompt_token_ids=tokens,
                    tenant=tenant,
                    parts=parts,
                )
            ],
            source="gateway",
            now=arrived_at,
        )
        self.settle()
        return request_id

    def settle(self) -> None:
        """Until the servers' events of the request are stored (published before its answer)."""
        wait_until(self._stored, timeout=30, what="the request's KV events")

    def _stored(self) -> bool:
        self.collector.poll(timeout_ms=15)
        self.collector.flush()
        return all_stored(self.servers)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        configs = [local_config(name="sim-a", num_blocks=20), local_config(name="sim-b")]
        with running_fleet(configs):
            servers = [register_server(**{k: str(v) for k, v in describe(c).items()}) for c in configs]
            for server in servers:
                scrape_server(server.pk)  # block size and model, as the scrape reads them
            servers = [Server.objects.get(pk=server.pk) for server in servers]
            joins = Handshakes()
            collector = KVEventCollector(context, flush_seconds=0, before_connect=joins)
            collector.subscribe(servers)
            joins.wait(len(servers), keep_alive=lambda: collector.poll(timeout_ms=20))
            joins.close()
            yield Fleet(servers, collector)
            collector.close()
    finally:
        context.destroy(linger=0)


@pytest.mark.parametrize("hash_only", [False, True])
def test_each_request_gets_the_cause_of_what_happened_to_its_prefix(
    fleet: Fleet, settings: Any, hash_only: bool
) -> None:
    settings.PREFIXSCOPE_HASH_ONLY = hash_only  # no token ids kept: the causes hold, to the block
    expected = {
        fleet.send(0, prompt(1)): "cold",
        # Server a holds the system prompt. The template's first departure (at its end): where its
        # prompts part is learned from it, so what follows it from now on is new content.
        fleet.send(1, prompt(3)): "routed_elsewhere",
        # The system prompt reused; past it, its question: its own, never reusable, not a loss.
        fleet.send(0, prompt(2)): "new_content",
        fleet.send(0, prompt(4, changed_at=70)): "prompt_changed",
        fleet.send(
            0, prompt(5), salt="acme-2026"
        ): "salt",  # from the chain without its salt, stored at ingest
    }
    for seed in range(6, 10):  # server a holds 19 blocks: these push the system prompt out
        fleet.send(0, [random.Random(seed).randrange(1, 50_000) for _ in range(200)], template="other")
    expected[fleet.send(0, prompt(10))] = "evicted"

    assert diagnose_requests(now=timezone.now() + timedelta(minutes=1)) == fleet.sent
    found = {d.request_id: d for d in RequestDiagnosis.objects.all()}
    assert {request_id: found[request_id].cause for request_id in expected} == expected
    question = found[next(r for r, cause in expected.items() if cause == "new_content")]
    assert (question.diverged_at, question.reused_tokens, question.new_content_tokens) == (None, 160, 32)
    assert question.prompt_changed_tokens == 0
    # Changed in the system prompt: lost up to where the family's prompts part (token 160), its
    # question's block after that is new content.
    changed = found[next(r for r, cause in expected.items() if cause == "prompt_changed")]
    assert (changed.diverged_at, changed.reused_tokens, changed.prompt_changed_tokens) == (
        64 if hash_only else 70,
        64,
        96,
    )
    assert changed.new_content_tokens == 32
    assert changed.below_block_tokens == 8
    routed = found[next(r for r, cause in expected.items() if cause == "routed_elsewhere")]
    assert routed.losses[0]["server_id"] == fleet.servers[0].pk and routed.resident_anywhere_tokens >= 160
    evicted = found[next(r for r, cause in expected.items() if cause == "evicted")]
    assert "removed_at" in evicted.losses[0] and evicted.seen_before_tokens >= 160
    assert diagnose_requests(now=timezone.now() + timedelta(minutes=1)) == 0  # each request once


def test_a_requests_diagnosis_reads_the_same_in_the_api_and_on_its_page(fleet: Fleet, client: Client) -> None:
    fleet.send(0, prompt(1))
    routed = fleet.send(1, prompt(1))
    diagnose_requests(now=timezone.now() + timedelta(minutes=1))
    client.force_login(fleet_viewer("engineer"))

    answer = client.get(f"/api/v1/requests/sim-b/{routed}/diagnosis")
    assert answer.status_code == 200
    found = answer.json()  # one object: a single request's diagnosis
    assert (found["cause"], found["template"], found["diagnosed"]) == ("routed_elsewhere", "support", True)
    assert found["funnel"]["resident_anywhere_tokens"] == 192 and found["funnel"]["reused_tokens"] == 0
    assert found["lost_tokens"] == {"routed_elsewhere": 192, "below_block": 8}
    assert found["losses"][0]["server_id"] == fleet.servers[0].pk
    assert client.get("/api/v1/requests/sim-b/nobody/diagnosis").status_code == 404

    page = client.get(reverse("dashboard:request-detail", args=["sim-b", routed])).content.decode()
    assert "Routed elsewhere" in page and "resident on sim-a: its first 192 tokens" in page
    assert client.get("/api/v1/miss-causes").json()["routed_elsewhere"] == 192
    fleet_page = client.get(reverse("dashboard:home")).content.decode()
    assert (
        "Prompt tokens lost, by cause" in fleet_page
        and "Routed elsewhere" in fleet_page
        and reverse("dashboard:request-detail", args=["sim-b", routed]) in fleet_page
    )


def test_a_changed_prompt_names_its_changed_part_in_the_api_its_hosted_shapes_and_its_page(
    fleet: Fleet, client: Client
) -> None:
    parts = PartDigests(system="5157", tools=["a1", "b2"], tools_sent="c3", messages=["d4"], latest=1)
    first = fleet.send(0, prompt(1), parts=parts)
    reordered = PartDigests(system="5157", tools=["b2", "a1"], tools_sent="e5", messages=["f6"], latest=1)
    changed = fleet.send(0, prompt(2, changed_at=70), parts=reordered)
    routed = fleet.send(1, prompt(2, changed_at=70), parts=reordered)
    diagnose_requests(now=timezone.now() + timedelta(minutes=1))
    client.force_login(fleet_viewer("engineer"))

    found = client.get(f"/api/v1/requests/sim-a/{changed}/diagnosis").json()
    assert (found["cause"], found["diverged_at"], found["changed_part"], found["part_detail"]) == (
        "prompt_changed", 70, "tools", "reordered",
    )  # fmt: skip
    assert found["compared_with"] == first
    assert found["prompt_cache_diagnostics"] == {
        "type": "cache_miss", "reason": "tools_changed", "cache_missed_tokens": 128,
        "comparison_reusable_tokens": 64, "comparison_request_id": first,
    }  # fmt: skip
    assert found["anthropic_diagnostics"] == {
        "cache_miss_reason": "tools_changed",
        "cache_missed_input_tokens": 128,
    }
    other = client.get(f"/api/v1/requests/sim-b/{routed}/diagnosis").json()
    assert other["cause"] == "routed_elsewhere" and other["prompt_cache_diagnostics"]["type"] == "unavailable"
    assert other["anthropic_diagnostics"]["cache_miss_reason"] is None  # no structural change
    page = client.get(reverse("dashboard:request-detail", args=["sim-a", changed])).content.decode()
    assert "tools reordered" in page
    listed = client.get(reverse("dashboard:requests")).content.decode()
    assert "at 70: tools reordered" in listed


def test_losses_roll_up_per_minute_into_routing_effectiveness_and_the_tenant_audit(
    fleet: Fleet, client: Client
) -> None:
    fleet.send(0, prompt(1), tenant="acme")
    fleet.send(1, prompt(2), tenant="acme")  # routed away from the system prompt on sim-a
    fleet.send(0, prompt(3), tenant="globex", salt="globex-2026")  # isolated by its salt
    fleet.send(0, prompt(4), tenant="acme")  # reused on sim-a
    # A record reporting more cached tokens than its salt had resident: a salt dropped on the way.
    arrived_at = timezone.now()
    ingest_request_records(
        [
            RequestFacts(
                request_id="leak-1",
                arrived_at=arrived_at,
                server="sim-a",
                model=fleet.servers[0].model,
                template="support",
                prompt_tokens=200,
                cached_tokens=160,
                cache_salt="initech-2026",
                prompt_token_ids=prompt(5),
                tenant="initech",
            )
        ],
        source="gateway",
        now=arrived_at,
    )
    diagnose_requests(now=timezone.now() + timedelta(minutes=1))

    diagnoses = list(RequestDiagnosis.objects.all())
    for tenant in ("acme", "globex", "initech"):  # the rollup sums what the diagnoses say
        mine = [d for d in diagnoses if d.tenant == tenant]
        rolled = LossMinute.objects.filter(tenant=tenant)
        assert sum(m.requests for m in rolled) == len(mine)
        for column in ("reused_tokens", "resident_anywhere_tokens", "routed_elsewhere_tokens", "salt_tokens"):
            assert sum(getattr(m, column) for m in rolled) == sum(getattr(d, column) for d in mine), column
    rows_before = sorted(LossMinute.objects.values_list("minute", "tenant", "requests", "reused_tokens"))
    refresh_loss_minutes(since=arrived_at - timedelta(minutes=5), until=arrived_at + timedelta(minutes=5))
    assert (
        sorted(LossMinute.objects.values_list("minute", "tenant", "requests", "reused_tokens")) == rows_before
    )

    client.force_login(fleet_viewer("engineer"))
    (group,) = client.get("/api/v1/routing").json()  # the two servers serve one model
    assert sorted(group["servers"]) == ["sim-a", "sim-b"] and group["routed_elsewhere_tokens"] == 160
    reused = sum(d.reused_tokens for d in diagnoses)
    anywhere = sum(d.resident_anywhere_tokens for d in diagnoses)
    assert group["effectiveness"] == pytest.approx(reused / anywhere)
    by_tenant = {row["group"]["tenant"]: row for row in client.get("/api/v1/losses?by=tenant").json()}
    assert by_tenant["acme"]["requests"] == 3 and by_tenant["acme"]["lost_tokens"]["routed_elsewhere"] == 160
    assert by_tenant["globex"]["lost_tokens"]["salt"] == 160  # its system prompt
    per_minute = client.get("/api/v1/losses?by=server&per_minute=true").json()
    assert all(row["minute"] for row in per_minute)
    assert sum(row["requests"] for row in per_minute) == len(diagnoses)

    audit = client.get("/api/v1/tenants/audit").json()
    assert audit["tenants"][0]["tenant"] == "initech" and audit["tenants"][0]["unexpected_hits"] == 1
    assert [hit["request_id"] for hit in audit["unexpected_hits"]] == ["leak-1"]
    assert next(t for t in audit["tenants"] if t["tenant"] == "globex")["salt_tokens"] == 160
    page = client.get(reverse("dashboard:tenants")).content.decode()
    assert "initech" in page and reverse("dashboard:request-detail", args=["sim-a", "leak-1"]) in page
    fleet_page = client.get(reverse("dashboard:home")).content.decode()
    assert "Routing effectiveness" in fleet_page and "sim-a, sim-b" in fleet_page


def test_a_run_goes_on_from_the_replay_the_last_one_left_and_replays_again_for_a_late_record(
    fleet: Fleet, settings: Any
) -> None:
    settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS = 0
    first = fleet.send(0, prompt(1))
    assert diagnose_requests(now=timezone.now()) == 1
    assert diagnose_requests(now=timezone.now() - timedelta(minutes=5)) == 0  # a clock behind: nothing
    # Without its history the next run could not know that sim-a holds the system prompt: the
    # events it read are gone from the database (as retention drops raw events), not from its replay.
    KVEvent.objects.all().delete()
    routed = fleet.send(1, prompt(2))
    assert diagnose_requests(now=timezone.now()) == 1
    assert RequestDiagnosis.objects.get(request_id=routed).cause == "routed_elsewhere"

    # A record older than what the last run applied: replayed again from before it, from the database.
    late_at = RequestDiagnosis.objects.get(request_id=first).arrived_at + timedelta(milliseconds=1)
    ingest_request_records(
        [
            RequestFacts(
                request_id="late-1",
                arrived_at=late_at,
                server="sim-a",
                model=fleet.servers[0].model,
                template="support",
                prompt_tokens=200,
                cached_tokens=0,
                prompt_token_ids=prompt(3),
            )
        ],
        source="gateway",
        now=timezone.now(),
    )
    assert diagnose_requests(now=timezone.now()) == 1
    late = RequestDiagnosis.objects.get(request_id="late-1")
    assert late.seen_before_tokens == 160  # the first request's system prompt, read again
    assert RequestDiagnosis.objects.count() == 3  # each once
