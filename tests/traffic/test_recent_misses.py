"""The Fleet page's recent misses: the diagnoses that lost the most reusable prompt tokens, most first
then newest, of the traffic the viewer sees; read by walking the diagnoses' index of that order
(RequestDiagnosis.REUSABLE_LOST), not by sorting the window's rows."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from app.core.tenancy import SEES_ALL, SEES_NOTHING, Viewer
from app.diagnosis.reads import recent_misses
from app.prompts.models import Template
from app.traffic.models import REUSABLE_LOST_COLUMNS, RequestDiagnosis
from app.traffic.services.partitions import ensure_day_partitions
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 3, 0, 20, tzinfo=UTC)  # the last hour crosses midnight: two partitions
VIEWERS = {
    "admin": SEES_ALL,
    "acme": Viewer(frozenset({"acme"})),
    "globex and hooli": Viewer(frozenset({"globex", "hooli"})),
    "nobody": SEES_NOTHING,
}
LOSSES = ("evicted_tokens", "salt_tokens", "cold_tokens", "routed_elsewhere_tokens")


@pytest.fixture
def diagnoses() -> list[RequestDiagnosis]:
    """Diagnoses over the last 90 minutes on servers of acme, globex and none, of templates of acme
    and none, with tenants acme, globex, hooli and none: lost tokens repeating every 7 (ties, told
    apart by time), every fifth also below one block, every ninth below one block alone."""
    servers = [a_server(name=f"vllm-{t or 'shared'}", tenant=t) for t in ("acme", "globex", "")]
    templates = [Template.objects.create(name="tpl-acme", tenant="acme"), None]
    tenants = ("acme", "globex", "hooli", "")
    rows = []
    for n in range(90):
        at = NOW - timedelta(minutes=90) + timedelta(minutes=n, seconds=n % 13)
        lost = {LOSSES[n % 4]: 16 * (n % 7), "below_block_tokens": 15 if n % 5 == 0 else 0}
        if n % 9 == 0:
            lost = {"below_block_tokens": 600}  # not reusable: never a miss to list
        rows.append(
            RequestDiagnosis(
                server=servers[n % 3],
                request_id=f"r{n}",
                arrived_at=at,
                diagnosed_at=at,
                tenant=tenants[n % 4],
                template=templates[n % 2],
                prompt_tokens=1000,
                cause="evicted",
                **lost,
            )
        )
    ensure_day_partitions(RequestDiagnosis, [row.arrived_at for row in rows])
    return RequestDiagnosis.objects.bulk_create(rows)


def test_the_reusable_loss_is_every_cause_but_what_no_cache_could_reuse() -> None:
    causes = {f"{cause.value}_tokens" for cause in RequestDiagnosis.Cause}
    never_reusable = {"below_block_tokens", "new_content_tokens", "below_minimum_tokens"}
    assert set(REUSABLE_LOST_COLUMNS) == causes - never_reusable


def _reusable(d: RequestDiagnosis) -> int:
    return sum(getattr(d, column) for column in REUSABLE_LOST_COLUMNS)


def _shown(d: RequestDiagnosis) -> int:
    """The reusable tokens lost as the query annotated them."""
    return int(d.reusable_lost)  # type: ignore[attr-defined]


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
def test_recent_misses_are_the_seen_diagnoses_that_lost_most_then_the_newest(
    diagnoses: list[RequestDiagnosis], viewer: Viewer
) -> None:
    since = NOW - timedelta(hours=1)
    seen = viewer.traffic(RequestDiagnosis.objects.filter(arrived_at__gte=since))
    expected = sorted(
        (d for d in seen if _reusable(d) > 0), key=lambda d: (-_reusable(d), -d.arrived_at.timestamp())
    )
    found = recent_misses(since=since, viewer=viewer, limit=12)
    assert [(d.request_id, _shown(d)) for d in found] == [(d.request_id, _reusable(d)) for d in expected[:12]]
    if viewer is SEES_ALL:  # ties by newest, both days, and the tail below a block left out, all met
        lost = [_shown(d) for d in found]
        assert len(set(lost)) < len(lost) and {d.arrived_at.day for d in found} == {2, 3}
        assert any(d.below_block_tokens for d in found)


def test_the_recent_misses_walk_their_index_and_sort_nothing(diagnoses: list[RequestDiagnosis]) -> None:
    """Sorting made the planner's last resort: it still sorts if the query's order is not the index's
    expression exactly; it is, so the plan reads each partition's index in order, merged."""
    for viewer in (SEES_ALL, VIEWERS["acme"]):
        with CaptureQueriesContext(connection) as queries:
            recent_misses(since=NOW - timedelta(hours=1), viewer=viewer)
        (query,) = queries.captured_queries
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + query["sql"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        nodes = [line.strip().removeprefix("->  ") for line in plan.splitlines()]
        assert not [node for node in nodes if node.startswith(("Sort  (", "Incremental Sort  ("))], plan
        assert plan.count("expr_arrived_at_idx on") >= 2, plan  # today's and yesterday's partitions
