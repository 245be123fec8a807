"""The requests explorer's query plans: a filtered first page and a later page read an index in the
page's order (no sort of the window, no OFFSET) and only the day partitions the window touches."""

import json
import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from app.domain.keyset import Cursor
from app.fleet.models import Server
from app.traffic.explorer import PAGE_SIZE, RequestFilters, matching_requests
from app.traffic.models import LOST_COLUMNS, RequestDiagnosis
from app.traffic.services.partitions import create_day_partitions, day_of
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts

pytestmark = pytest.mark.django_db

DAYS = 4
PER_DAY = 3_000


def _record(n: int, at: datetime) -> RequestFacts:
    return RequestFacts(
        request_id=f"r-{n}",
        arrived_at=at,
        server=f"vllm-{n % 2}",
        model="m",
        tenant=f"t{n % 3}",
        prompt_tokens=100 + n % 50,
        cached_tokens=n % 100,
    )


@pytest.fixture
def history() -> datetime:
    """PER_DAY records a day over DAYS days, ending "now"; the tables the query reads analysed, as
    autovacuum would. "Now" is yesterday at 18:00 UTC, not the clock's: where the window and the
    cursor cut the daily partitions decides how few of a partition's rows the planner expects, and on
    a few thousand rows a seq scan wins at some hours of the day (seen at 13:40)."""
    now = (timezone.now() - timedelta(days=1)).replace(hour=18, minute=0, second=0, microsecond=0)
    for n in range(8):
        Server.objects.create(name=f"vllm-{n}", base_url=f"http://127.0.0.1:9/{n}", block_size=16)
    step = timedelta(days=DAYS) / (DAYS * PER_DAY)
    start = now - timedelta(days=DAYS) + step
    facts = [_record(n, start + n * step) for n in range(DAYS * PER_DAY)]
    for first in range(0, len(facts), 4_000):
        assert ingest_request_records(facts[first : first + 4_000], source="rest", now=now).rejected == []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass",
            ["traffic_requestrecord"],
        )
        for (partition,) in cursor.fetchall():  # each one: other tests' statistics may linger
            cursor.execute(f"ANALYZE {partition}")
        # And the tables the page joins: stale statistics of a one-row fleet_server (left by other
        # tests) made the planner drive a nested loop from it and sort the window's rows.
        for table in ("traffic_requestrecord", "fleet_server", "prompts_template", "prompts_templateversion"):
            cursor.execute(f"ANALYZE {table}")
    return now


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


def _plan(filters: RequestFilters, after: Cursor | None) -> list[dict[str, Any]]:
    query = matching_requests(filters, after=after)[: PAGE_SIZE + 1]
    found = json.loads(query.explain(format="json"))
    logging.getLogger(__name__).info("plan:\n%s", query.explain())  # for a reader of the output
    return _nodes(found[0]["Plan"])


def _partitions_in(since: datetime, until: datetime) -> set[str]:
    """The request-record partitions whose day overlaps [since, until)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'traffic_requestrecord'::regclass"
        )
        bounds = cursor.fetchall()
    found = set()
    for name, bound in bounds:
        if " TO " not in bound:  # a default partition
            found.add(name)
            continue
        low, high = (datetime.fromisoformat(part.split("'")[1]) for part in bound.split(" TO "))
        if low < until and since < high:
            found.add(name)
    return found


@pytest.mark.parametrize(
    ("filters", "ordered"),
    [({}, True), ({"server": 1}, True), ({"tenant": "t1"}, True),
     # Estimated at fewer rows than a page: the planner sorts those few rather than read in order.
     ({"server": 0, "tenant": "t2", "hit_min": 20.0}, False)],
    ids=["no filter", "server", "tenant", "server, tenant and hit range"],
)  # fmt: skip
def test_first_and_later_pages_read_an_index_within_the_windows_partitions(
    history: datetime, filters: dict[str, Any], ordered: bool
) -> None:
    servers = {n: Server.objects.get(name=f"vllm-{n}").pk for n in range(8)}
    window = RequestFilters(
        since=history - timedelta(hours=30),
        until=history - timedelta(hours=6),
        server_id=servers[filters["server"]] if "server" in filters else None,
        tenant=filters.get("tenant"),
        hit_min=filters.get("hit_min"),
    )
    later = Cursor(history - timedelta(hours=20), servers[1], "r-0")
    wanted = _partitions_in(window.since, window.until)
    assert 1 < len(wanted) < DAYS + 1  # the window spans two days of the five
    for after in (None, later):
        nodes = _plan(window, after)
        scans = [n for n in nodes if n.get("Relation Name", "").startswith("traffic_requestrecord")]
        assert scans and {node["Relation Name"] for node in scans} <= wanted
        assert all(
            node["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan") for node in scans
        )
        if ordered:
            assert all(node.get("Scan Direction") == "Backward" for node in scans), scans
            assert not any(node["Node Type"] in ("Sort", "Incremental Sort") for node in nodes)


_DIAGNOSE_SQL = f"""
INSERT INTO traffic_requestdiagnosis (server_id, request_id, arrived_at, diagnosed_at, template_id,
    template_version_id, tenant, cause, unknown, unexpected_hit, prompt_tokens, seen_before_tokens,
    resident_anywhere_tokens, resident_here_tokens, reused_tokens, {", ".join(LOST_COLUMNS.values())}, losses)
SELECT server_id, request_id, arrived_at, arrived_at, template_id, template_version_id, tenant,
       CASE WHEN cached_tokens % 3 = 0 THEN 'cold' ELSE 'evicted' END, '', false, prompt_tokens, 0, 0, 0,
       cached_tokens, {", ".join(["prompt_tokens - cached_tokens"] + ["0"] * (len(LOST_COLUMNS) - 1))}, '[]'
FROM traffic_requestrecord
"""


@pytest.mark.parametrize(
    "filters", [{"cause": "evicted"}, {"missed_only": True}, {"cause": "evicted", "server": 1}],
    ids=["cause", "missed only", "server and cause"],
)  # fmt: skip
def test_a_diagnosis_filter_probes_each_record_in_the_pages_order_instead_of_sorting_a_join(
    history: datetime, filters: dict[str, Any]
) -> None:
    """A cause (or missed-only) filter that most records pass: the records' index read backwards and
    each record's diagnosis looked up by its key until the page is full. As an EXISTS, PostgreSQL
    made it a semi-join on the three-column key, estimated it at one row and sorted the window's
    matches (2 s over a week of a million records, bench/bench_pages.py)."""
    create_day_partitions(RequestDiagnosis, [day_of(history - timedelta(days=d)) for d in range(DAYS + 1)])
    with connection.cursor() as cursor:
        cursor.execute(_DIAGNOSE_SQL)
        cursor.execute("ANALYZE traffic_requestdiagnosis")
    server = Server.objects.get(name="vllm-1").pk if "server" in filters else None
    window = RequestFilters(
        since=history - timedelta(hours=30),
        until=history - timedelta(hours=6),
        server_id=server,
        cause=filters.get("cause"),
        missed_only=filters.get("missed_only", False),
    )
    for after in (None, Cursor(history - timedelta(hours=20), Server.objects.get(name="vllm-1").pk, "r-0")):
        nodes = _plan(window, after)
        records = [n for n in nodes if n.get("Relation Name", "").startswith("traffic_requestrecord")]
        diagnoses = [n for n in nodes if n.get("Relation Name", "").startswith("traffic_requestdiagnosis")]
        assert records and all(node.get("Scan Direction") == "Backward" for node in records), records
        assert not any(node["Node Type"] in ("Sort", "Incremental Sort", "Hash Join") for node in nodes)
        assert diagnoses and all(node["Node Type"] in ("Index Scan", "Index Only Scan") for node in diagnoses)
        assert all(node.get("Parent Relationship") == "SubPlan" for node in nodes if node.get("Subplan Name"))
        assert len(matching_requests(window, after=after)[:PAGE_SIZE]) == PAGE_SIZE
