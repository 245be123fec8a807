"""Miss causes against what each fault scenario injected: the demo's templates and tenants, one fault
per run, through the same path as a deployment (the simulated fleet behind `manage.py gateway`, its KV
events collected by `manage.py collect_kv_events`), then diagnosed.

Which requests a fault must have hit, and with what cause, is read from what the scenario did (the
fault's commit on a record's version, the new salt, the restart's new epoch, the capacity cut's time,
where each prompt had been served); the confusion table of every scenario is printed, and each must be
right for at least ACCURACY of the requests its fault hit.
"""

import asyncio
import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.db.models import F, Q
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.fleet.services import register_server
from app.traffic.collection.kv_leases import lease_holders
from app.traffic.models import KVEvent, RejectedInput, RequestDiagnosis, RequestRecord
from app.traffic.tasks import scrape_server
from simulator.fleet import describe
from simulator.scenario import load_scenario, resolve_scenario
from simulator.scenario_side import SIDE_FIELDS
from simulator.sender import run
from simulator.server import ServerConfig
from simulator.template_repo import create_repo
from tests.support.ports import unused_ports
from tests.support.processes import Command, database_url_for_tests, wait_until
from tests.support.published import all_stored
from tests.support.simulated_fleet import local_config, running_fleet

pytestmark = pytest.mark.django_db(transaction=True)

ACCURACY = 0.9
FAULT_AT, DURATION, SPEED = 60, 240, 16  # virtual seconds; a run takes DURATION / SPEED wall seconds


def scenario(**changes: Any) -> dict[str, Any]:
    """The demo scenario's templates and tenants, shorter, with `changes` (timeline, servers ...);
    without its side traffic (tests/traffic/test_demo_side_traffic.py runs that)."""
    with resolve_scenario("demo").open() as file:
        found: dict[str, Any] = yaml.safe_load(file)
    for side in SIDE_FIELDS:
        found.pop(side, None)
    found = copy.deepcopy(found) | {
        "duration": DURATION,
        "timeline": [],
        "servers": {**found["servers"], "count": 2},
    }
    return found | changes


def fault(template: str, name: str) -> dict[str, Any]:
    return scenario(timeline=[{"at": FAULT_AT, "template": template, "change": {"fault": name}}])


SCENARIOS = {
    "volatile_top": fault("support", "volatile_top"),
    "unsorted_tools": fault("support", "unsorted_tools"),
    "shuffled_chunks": fault("support", "shuffled_chunks"),
    "random_json_keys": fault("billing", "random_json_keys"),
    "salt_change": scenario(
        timeline=[{"at": FAULT_AT, "salt_change": {"tenant": "acme", "cache_salt": "acme-new"}}]
    ),
    "capacity_cut": scenario(
        servers={"count": 1, "block_size": 16, "num_blocks": 256},
        timeline=[{"at": FAULT_AT, "capacity_cut": {"server": 0, "num_blocks": 64}}],  # about two prompts
    ),
    "server_restart": scenario(timeline=[{"at": FAULT_AT, "server_restart": {"server": 1}}]),
    "random_routing": scenario(routing="random", servers={"count": 3, "block_size": 16, "num_blocks": 256}),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Request:
    """A stored request with its diagnosis, as the expectations read it."""

    server: str
    arrived_at: datetime
    template: str
    version: str
    tenant: str
    salt: str
    cause: str
    diverged_at: int | None
    request_id: str
    token_ids: list[int]
    cached_tokens: int
    block_size: int


@dataclass(frozen=True, slots=True)
class Ran:
    requests: list[Request]
    # When the capacity cut was asked for, and when it was done (0.1 s later than its answer: the
    # gateway stamps arrivals by its own clock).
    cut: tuple[datetime, datetime] | None


def run_scenario(
    definition: dict[str, Any],
    tmp_path: Path,
    *,
    configure: Callable[[list[ServerConfig]], list[ServerConfig]] = lambda configs: configs,
) -> Ran:
    """Serve, send, collect and diagnose one scenario; its requests in arrival order. `configure`
    makes the servers as a test needs them (their quirks)."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(definition))
    loaded = load_scenario(path)
    shape = loaded.servers
    configs = [
        local_config(
            name=f"sim-{i}",
            block_size=shape.block_size,
            num_blocks=shape.num_blocks,
            model=loaded.model,
        )
        for i in range(loaded.server_count)  # the side servers after the routed ones
    ]
    configs = configure(configs)
    with running_fleet(configs):
        server_ids = set()
        for config in configs:
            server = register_server(**{k: str(v) for k, v in describe(config).items()})
            scrape_server(server.pk)
            server_ids.add(server.pk)
        ports = unused_ports(len(configs))
        routes = [
            f"--listen 127.0.0.1:{p} --upstream {c.base_url} --server {c.name}".split()
            for p, c in zip(ports, configs, strict=True)
        ]
        gateway = Command(
            database_url_for_tests(),
            tmp_path / "gateway.log",
            "gateway",
            *(part for route in routes for part in route),
            "--flush-seconds",
            "0.2",
        )
        collector = Command(
            database_url_for_tests(), tmp_path / "kv.log", "collect_kv_events",
            "--flush-seconds", "0.2", "--rescan-seconds", "1",
        )  # fmt: skip
        try:
            collector.start()
            gateway.start()
            for port in ports:
                gateway.wait_listening(port)
            # The collector leases each server on its first scan, then subscribes and asks the
            # server's replay for what it published before (nothing is lost to a late subscription).
            wait_until(lambda: set(lease_holders()) >= server_ids, timeout=30, what="the KV-event leases")
            start = datetime.now(UTC).replace(microsecond=0)
            commits = create_repo(tmp_path / "templates", loaded, start)
            urls = [f"http://127.0.0.1:{port}" for port in ports]
            began = datetime.now(UTC)  # the run's clock starts a few ms later: its seconds count from here
            summary = asyncio.run(run(loaded, urls, speed=SPEED, commits=commits, seed=0, start=start))
            answered = sum(1 for result in summary.results if result.error is None)
            try:
                wait_until(lambda: RequestRecord.objects.count() >= answered, timeout=30, what="records")
            except AssertionError:
                stored = set(RequestRecord.objects.values_list("request_id", flat=True))
                lost = [r for r in summary.results if r.error is None and r.request_id not in stored]
                refused = list(RejectedInput.objects.values_list("source", "reason", "count"))
                sent = {r.request_id for r in summary.results}
                others = sorted(stored - sent)[:20]
                missing = [r.request_id for r in lost]
                raise AssertionError(f"not stored: {missing}; others: {others}; refused: {refused}") from None
            wait_until(lambda: all_stored(Server.objects.all()), timeout=30, what="the KV events")
        finally:
            gateway.ensure_stopped()
            collector.ensure_stopped()
    cut = next(
        (
            (began + timedelta(seconds=c.sent_after), began + timedelta(seconds=c.answered_after + 0.1))
            for c in summary.admin_calls
            if c.action == "capacity"
        ),
        None,
    )
    diagnose_requests(now=timezone.now() + timedelta(minutes=5))
    return Ran(_stored_requests(), cut)


def _stored_requests() -> list[Request]:
    diagnoses = {(d.server_id, d.request_id): d for d in RequestDiagnosis.objects.all()}
    names = dict(Server.objects.values_list("pk", "name"))
    sizes = dict(Server.objects.values_list("pk", "block_size"))
    found = []
    for record in RequestRecord.objects.select_related("template", "template_version").order_by("arrived_at"):
        diagnosis = diagnoses[record.server_id, record.request_id]
        found.append(
            Request(
                names[record.server_id],
                record.arrived_at,
                record.template.name if record.template else "",
                record.template_version.commit_sha if record.template_version else "",
                record.tenant,
                record.salt_hash,
                diagnosis.cause or diagnosis.unknown or "reused",
                diagnosis.diverged_at,
                record.request_id,
                record.token_ids or [],
                record.cached_tokens or 0,
                sizes[record.server_id] or 1,
            )
        )
    return found


# -- what each fault must have caused -------------------------------------------------------------


def after_template_fault(template: str) -> Callable[[Ran], dict[str, str]]:
    """The requests of the template rendered from the fault's commit, each expected to lose most to
    what an independent, brute-force reading of the token ids says (`lost_most_to`)."""

    def expected(ran: Ran) -> dict[str, str]:
        first = next(r.version for r in ran.requests if r.template == template)
        hit = {r.request_id for r in ran.requests if r.template == template and r.version != first}
        return {r: cause for r, cause in lost_most_to(ran.requests).items() if r in hit}

    return expected


def lost_most_to(requests: list[Request]) -> dict[str, str]:
    """For each request, against every earlier prompt's token ids (not hashes, not events): the
    blocks past what it reused that an earlier prompt under its own salt had are lost to the cache
    ("cache": evicted or routed elsewhere), those only another salt's prompt had to the salt, the
    rest to the prompt's change up to where its template's prompts part (`fan_out_points`), and
    past that its own new content; the request's cause is the one of the most blocks lost, else
    new_content."""
    points = fan_out_points(requests)
    found = {}
    for index, r in enumerate(requests):
        size = r.block_size
        reusable = max(len(r.token_ids) - 1, 0) // size
        reused = min(r.cached_tokens // size, reusable)
        same = other = 0
        for earlier in requests[:index]:
            shared = _common_prefix(r.token_ids, earlier.token_ids) // size
            if earlier.salt == r.salt:
                same = max(same, shared)
            else:
                other = max(other, shared)
        same, other = min(same, reusable), min(other, reusable)
        stable = min(points.get(r.template, reusable * size) // size, reusable)
        blocks = {
            "cache": max(same - reused, 0),
            "salt": max(other - max(same, reused), 0),
            "prompt_changed": max(stable - max(same, other, reused), 0),
        }
        if any(blocks.values()):
            found[r.request_id] = max(blocks, key=lambda cause: blocks[cause])
        elif reusable > max(same, other, reused):
            found[r.request_id] = "new_content"
    return found


def fan_out_points(requests: list[Request]) -> dict[str, int]:
    """Where each template's prompts part, read from its first version's requests alone (before any
    fault): the tenth-lowest of the token positions where each departs from every earlier prompt of
    its template."""
    firsts: dict[str, str] = {}
    departures: dict[str, list[int]] = {}
    seen: dict[str, list[list[int]]] = {}
    for r in requests:
        if firsts.setdefault(r.template, r.version) != r.version:
            continue
        earlier = seen.setdefault(r.template, [])
        shared = max((_common_prefix(r.token_ids, other) for other in earlier), default=0)
        if 0 < shared < len(r.token_ids):
            departures.setdefault(r.template, []).append(shared)
        earlier.append(r.token_ids)
    return {template: sorted(found)[len(found) // 10] for template, found in departures.items()}


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def first_under_the_new_salt(ran: Ran) -> dict[str, str]:
    """The first request of each template under the tenant's new salt: the same tokens, another salt."""
    old = next(r.salt for r in ran.requests if r.tenant == "acme")
    firsts: dict[str, str] = {}
    for r in ran.requests:
        if r.tenant == "acme" and r.salt != old and r.template not in firsts:
            firsts[r.template] = r.request_id
    return dict.fromkeys(firsts.values(), "salt")


def first_after_the_restart(ran: Ran) -> dict[str, str]:
    """The first request of each template and tenant on the restarted server after its new epoch."""
    restarted = KVEvent.objects.filter(epoch__gt=0).order_by("emitted_at").select_related().first()
    assert restarted is not None, "the restart started no new epoch"
    name = Server.objects.get(pk=restarted.server_id).name
    seen: set[tuple[str, str]] = set()
    found = {}
    for r in ran.requests:
        if r.server == name and r.arrived_at > restarted.emitted_at and (r.template, r.tenant) not in seen:
            seen.add((r.template, r.tenant))
            found[r.request_id] = "restarted"
    return found


def lost_to_the_cut(ran: Ran) -> dict[str, str]:
    """After the cut (a restart with room for about two prompts: vLLM sizes its cache at start), what
    the token ids say was lost to the cache is `restarted` for a prompt's first return since the
    cut, `evicted` after that (one server: nothing is routed elsewhere)."""
    assert ran.cut is not None
    asked, done = ran.cut
    since_cut: set[tuple[str, str]] = set()
    unsure: set[tuple[str, str]] = set()  # arrived while the server restarted: the old process or the new
    found = {}
    by_token = lost_most_to(ran.requests)
    for r in ran.requests:
        if r.arrived_at <= asked:
            continue
        key = (r.template, r.salt)
        if r.arrived_at <= done:
            unsure.add(key)
            continue
        if key in unsure:  # its first return since the cut, or its second: not judged
            unsure.discard(key)
        elif by_token.get(r.request_id) == "cache":
            found[r.request_id] = "evicted" if key in since_cut else "restarted"
        since_cut.add(key)
    return found


def first_here_after_elsewhere(ran: Ran) -> dict[str, str]:
    """A template and salt served before on another server, first time on this one."""
    where: dict[tuple[str, str], set[str]] = {}
    found = {}
    for r in ran.requests:
        servers = where.setdefault((r.template, r.salt), set())
        if servers and r.server not in servers:
            found[r.request_id] = "routed_elsewhere"
        servers.add(r.server)
    return found


# What the token-exact reading calls "cache": it knows nothing of the servers' caches, so it cannot
# tell eviction from routing (the two scenarios that inject those tell them apart).
CACHE = {"evicted": "cache", "routed_elsewhere": "cache"}
EXPECTED = {
    "volatile_top": after_template_fault("support"),
    "unsorted_tools": after_template_fault("support"),
    "shuffled_chunks": after_template_fault("support"),
    "random_json_keys": after_template_fault("billing"),
    "salt_change": first_under_the_new_salt,  # one a template: later ones reuse the new salt's prefix
    "capacity_cut": lost_to_the_cut,
    "server_restart": first_after_the_restart,
    "random_routing": first_here_after_elsewhere,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_faults_requests_get_the_cause_it_injected(name: str, tmp_path: Path) -> None:
    ran = run_scenario(SCENARIOS[name], tmp_path)
    expected = EXPECTED[name](ran)
    as_read = CACHE if "cache" in expected.values() else {}
    found = {r.request_id: as_read.get(r.cause, r.cause) for r in ran.requests}
    table = Counter((cause, found[request_id]) for request_id, cause in expected.items())
    misses = [(r, found[r]) for r, cause in expected.items() if found[r] != cause]
    print(f"\n{name}: {len(expected)} requests hit of {len(ran.requests)}; expected -> found: {dict(table)}")  # noqa: T201
    print(f"  misses: {misses[:10]}")  # noqa: T201
    assert len(expected) >= 3, f"the fault hit too few requests to judge: {len(expected)}"
    right = sum(count for (cause, got), count in table.items() if cause == got)
    assert right / len(expected) >= ACCURACY, f"{name}: {dict(table)}, misses {misses[:10]}"
    # Each step of every request's funnel holds the next: reused <= here <= anywhere <= seen before.
    assert not RequestDiagnosis.objects.filter(
        Q(reused_tokens__gt=F("resident_here_tokens"))
        | Q(resident_here_tokens__gt=F("resident_anywhere_tokens"))
        | Q(resident_anywhere_tokens__gt=F("seen_before_tokens"))
    ).exists()
    if name == "volatile_top":
        diverged = [r.diverged_at for r in ran.requests if r.request_id in expected]
        assert all(at is not None and at < 24 for at in diverged), diverged  # in the moved first line
