"""The salt audit's rollups of unsalted first blocks (UnsaltedPrefixMinute, UnsaltedPrefixHour) and
what the audit reads from them (shared_unsalted_prefixes): equal to the request records summed apart,
for every viewer, over windows of minutes and hours. Records stored through the real ingest path
(block hashes computed from the token ids and the cache salt)."""

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.core.tenancy import SEES_ALL, SEES_NOTHING, Viewer
from app.diagnosis.tenants import shared_unsalted_prefixes
from app.fleet.models import Server
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import RequestRecord, UnsaltedPrefixHour, UnsaltedPrefixMinute
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts

pytestmark = pytest.mark.django_db

BLOCK = 16
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
rng = random.Random(7)
SYSTEM, OTHER, THIRD = ([rng.randrange(1, 50_000) for _ in range(2 * BLOCK)] for _ in range(3))
VIEWERS = {
    "admin": SEES_ALL,
    "acme": Viewer(frozenset({"acme"})),
    "acme and globex": Viewer(frozenset({"acme", "globex"})),
    "acme and umbrella": Viewer(frozenset({"acme", "umbrella"})),
    "nobody": SEES_NOTHING,
}


def facts(
    request_id: str, minutes: float, tenant: str, start: list[int] | None, *, salt: str | None = None,
    server: str = "vllm-a", template: str = "support",
) -> RequestFacts:  # fmt: skip
    """A request `minutes` after START beginning with `start` (None: a first block of its own)."""
    first = start if start is not None else [rng.randrange(1, 50_000) for _ in range(BLOCK)]
    tokens = first + [rng.randrange(1, 50_000) for _ in range(BLOCK + 3)]
    return RequestFacts(
        request_id=request_id, arrived_at=START + timedelta(minutes=minutes), server=server, model="m",
        tenant=tenant, template=template, prompt_tokens=len(tokens), prompt_token_ids=tokens,
        cache_salt=salt,
    )  # fmt: skip


SENT = [
    # SYSTEM: acme and globex in hour 9 (two templates), acme and umbrella in hour 11, globex alone in 13.
    facts("a1", 10, "acme", SYSTEM),
    facts("g1", 20, "globex", SYSTEM, server="vllm-b", template="billing"),
    facts("a2", 50, "acme", SYSTEM),
    facts("a3", 125, "acme", SYSTEM, server="vllm-b"),
    facts("u1", 126.5, "umbrella", SYSTEM),
    facts("g2", 4 * 60 + 30, "globex", SYSTEM),  # alone in its hour: not counted
    # OTHER: umbrella and acme in hour 9.
    facts("u2", 15, "umbrella", OTHER),
    facts("a4", 16, "acme", OTHER),
    # THIRD: salted twice (initech), unsalted once (hooli), twice without a tenant: none counted.
    facts("i1", 30, "initech", THIRD, salt="initech-2026"),
    facts("i2", 31, "initech", THIRD, salt="initech-2026"),
    facts("h1", 32, "hooli", THIRD),
    facts("n1", 33, "", THIRD),
    facts("n2", 34, "", THIRD),
    # A volatile first token: each first block its own.
    *(facts(f"v{n}", 40 + n, tenant, None) for n, tenant in enumerate(["acme", "globex"] * 3)),
]


@pytest.fixture
def stored() -> list[RequestRecord]:
    for name, tenant in (("vllm-a", ""), ("vllm-b", "acme")):
        Server.objects.create(name=name, base_url=f"http://127.0.0.1:9/{name}", block_size=BLOCK, model="m",
                              tenant=tenant)  # fmt: skip
    assert ingest_request_records(SENT, source="gateway", now=START + timedelta(hours=6)).rejected == []
    refresh_minute_rollups(since=START, until=START + timedelta(hours=6))
    return list(RequestRecord.objects.select_related("server", "template"))


def expected_minutes(records: list[RequestRecord]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """The unsalted prefix minutes summed apart from the records: per minute, model, first block,
    tenant and template, of the first blocks two requests sent in the hour; requests and latest key."""
    unsalted = [r for r in records if not r.salt_hash and r.tenant and r.block_hashes]
    in_hour: dict[tuple[Any, ...], int] = defaultdict(int)
    for r in unsalted:
        in_hour[r.arrived_at.replace(minute=0, second=0, microsecond=0), r.model, r.block_hashes[0]] += 1
    rows: dict[tuple[Any, ...], list[RequestRecord]] = defaultdict(list)
    for r in unsalted:
        if in_hour[r.arrived_at.replace(minute=0, second=0, microsecond=0), r.model, r.block_hashes[0]] >= 2:
            minute = r.arrived_at.replace(second=0, microsecond=0)
            rows[minute, r.model, r.block_hashes[0], r.tenant, r.template_id].append(r)
    return {key: _summed(found) for key, found in rows.items()}


def _summed(records: list[RequestRecord]) -> tuple[Any, ...]:
    latest = max(records, key=lambda r: (r.arrived_at, r.server_id, r.request_id))
    return len(records), latest.arrived_at, latest.server_id, latest.request_id


def stored_rows(model: type[Any], period: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {
        (getattr(row, period), row.model, row.first_block, row.tenant, row.template_id): (
            row.requests, row.last_seen_at, row.last_server_id, row.last_request_id,
        )
        for row in model.objects.all()
    }  # fmt: skip


def test_the_rollup_keeps_the_unsalted_first_blocks_two_requests_sent_in_an_hour(
    stored: list[RequestRecord],
) -> None:
    minutes = stored_rows(UnsaltedPrefixMinute, "minute")
    assert minutes == expected_minutes(stored)
    assert {key[3] for key in minutes} == {"acme", "globex", "umbrella"}  # no initech, hooli nor ""
    assert sum(requests for requests, *_ in minutes.values()) == 7  # a1-a4, g1, u1, u2: not g2 nor v*
    hours: dict[tuple[Any, ...], list[Any]] = {}
    for (minute, *key), (requests, at, server, request) in sorted(minutes.items()):
        hour = hours.setdefault((minute.replace(minute=0), *key), [0, at, server, request])
        hour[0] += requests
        hour[1:] = max(hour[1:], [at, server, request])
    assert stored_rows(UnsaltedPrefixHour, "hour") == {key: tuple(row) for key, row in hours.items()}


def test_a_rerun_of_part_of_an_hour_writes_the_same_rows(stored: list[RequestRecord]) -> None:
    before = stored_rows(UnsaltedPrefixMinute, "minute"), stored_rows(UnsaltedPrefixHour, "hour")
    refresh_minute_rollups(since=START + timedelta(minutes=49), until=START + timedelta(minutes=51))
    assert (stored_rows(UnsaltedPrefixMinute, "minute"), stored_rows(UnsaltedPrefixHour, "hour")) == before


def audited(since: datetime, until: datetime, viewer: Viewer = SEES_ALL) -> list[tuple[Any, ...]]:
    """The audit's rows: whether the block is SYSTEM's, tenants, templates, requests, samples."""
    return [
        (p.first_block == system_hash(), p.tenants, p.templates, p.requests,
         [(s.tenant, s.server_name, s.request_id) for s in p.samples])
        for p in shared_unsalted_prefixes(since=since, until=until, viewer=viewer)
    ]  # fmt: skip


def system_hash() -> int:
    """SYSTEM's first block as the ingest hashed it, a uint64."""
    first: int = RequestRecord.objects.get(request_id="a1").block_hashes[0]
    return first % 2**64


def test_the_audit_answers_over_the_window_in_minutes_and_hours(stored: list[RequestRecord]) -> None:
    hour = audited(START, START + timedelta(hours=1))
    assert hour == [
        (True, ["acme", "globex"], ["billing", "support"], 3,
         [("acme", "vllm-a", "a2"), ("globex", "vllm-b", "g1")]),
        (False, ["acme", "umbrella"], ["support"], 2,
         [("acme", "vllm-a", "a4"), ("umbrella", "vllm-a", "u2")]),
    ]  # fmt: skip
    day = audited(START - timedelta(hours=12), START + timedelta(hours=12))
    assert day[0] == (
        True, ["acme", "globex", "umbrella"], ["billing", "support"], 5,
        [("acme", "vllm-b", "a3"), ("globex", "vllm-b", "g1"), ("umbrella", "vllm-a", "u1")],
    )  # fmt: skip
    # Minutes at both edges, an hour between: a minute counts when it starts in the window (09:16 on,
    # to 11:05); u2 (09:15) out, so OTHER is acme's alone.
    since, until = (
        START + timedelta(minutes=15, seconds=30),
        START + timedelta(hours=2, minutes=5, seconds=30),
    )
    edges = audited(since, until)
    assert edges == [(True, ["acme", "globex"], ["billing", "support"], 3,
                      [("acme", "vllm-b", "a3"), ("globex", "vllm-b", "g1")])]  # fmt: skip


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
def test_a_viewer_sees_the_prefixes_shared_among_its_own_tenants_only(
    stored: list[RequestRecord], viewer: Viewer
) -> None:
    """What the audit shows a viewer is what the records it sees (Viewer.traffic) say, summed apart:
    a viewer of one tenant sees none, a viewer of two the prefixes those two share, with their
    requests and samples alone."""
    since, until = START - timedelta(hours=1), START + timedelta(hours=6)
    seen = viewer.traffic(RequestRecord.objects.select_related("server", "template"))
    counted = {
        (r.server_id, r.request_id) for r in stored for key in expected_minutes(stored) if _in_row(r, key)
    }
    per_block: dict[int, dict[str, list[RequestRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in seen:
        if (r.server_id, r.request_id) in counted:
            per_block[r.block_hashes[0] % 2**64][r.tenant].append(r)
    shared = [_audit_row(block, tenants) for block, tenants in per_block.items() if len(tenants) >= 2]
    expected = sorted(shared, key=lambda row: (-row[3], not row[0]))
    found = audited(since, until, viewer)
    assert found == expected
    if viewer.tenants is not None and len(viewer.tenants) < 2:
        assert found == []
    if viewer == VIEWERS["acme and globex"]:  # SYSTEM without umbrella's u1; OTHER (acme and umbrella) not
        assert found == [(True, ["acme", "globex"], ["billing", "support"], 4,
                          [("acme", "vllm-b", "a3"), ("globex", "vllm-b", "g1")])]  # fmt: skip


def _audit_row(block: int, tenants: dict[str, list[RequestRecord]]) -> tuple[Any, ...]:
    records = [r for found in tenants.values() for r in found]
    samples = [(tenant, *_latest(found)) for tenant, found in sorted(tenants.items())]
    templates = sorted({r.template.name for r in records if r.template})
    return block == system_hash(), sorted(tenants), templates, len(records), samples


def _in_row(record: RequestRecord, key: tuple[Any, ...]) -> bool:
    minute, model, block, tenant, template = key
    return (
        (record.arrived_at.replace(second=0, microsecond=0), record.model, record.tenant)
        == (minute, model, tenant)
        and bool(record.block_hashes)
        and record.block_hashes[0] == block
        and record.template_id == template
    )


def _latest(records: list[RequestRecord]) -> tuple[str, str]:
    latest = max(records, key=lambda r: (r.arrived_at, r.server_id, r.request_id))
    return latest.server.name, latest.request_id
