"""The contract every sum table keeps, checked for each entry of the catalog (app/rollups/catalog.py):

- a derived table is the table it sums, summed apart in Python (every number summed, histograms
  position by position, sketches index by index, maxima and latest as declared);
- the first-level tables' figures are the raw records and diagnoses summed apart;
- a late record moves every table holding its minute, and a rerun changes nothing;
- what each viewer reads of a table (app/rollups/visibility.py) is what it may see of the rows it
  sums, by the rules of app/core/tenancy.py stated again here, row by row.

A new sum table declared in the catalog is covered by adding nothing here.
"""

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db.models import FloatField, IntegerField, Model, QuerySet

from app.core.tenancy import SEES_ALL, SEES_NOTHING, Viewer
from app.fleet.models import Server
from app.prompts.models import Template
from app.rollups.catalog import ROLLUPS, Level, Owner, Rollup, rollup_of
from app.rollups.refresh import refresh_loss_minutes, refresh_minute_rollups
from app.rollups.servers import refresh_server_minutes
from app.rollups.visibility import visible, visible_sums
from app.traffic.models import LossMinute, MinuteRollup, RequestDiagnosis, RequestRecord
from app.traffic.services.partitions import ensure_day_partitions
from tests.support.server_traffic import a_served_server

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
END = START + timedelta(hours=12)
RECORDS = 90  # one every 7 minutes and 13 seconds: 10 h 50 min, every hour and quarter cut across
VIEWERS = {
    "admin": SEES_ALL,
    "acme": Viewer(frozenset({"acme"})),
    "globex and hooli": Viewer(frozenset({"globex", "hooli"})),
    "nobody": SEES_NOTHING,
}
DERIVED = [rollup for rollup in ROLLUPS if rollup.source is not None]


def _stored_traffic() -> None:
    """Records and diagnoses on servers of acme, globex and none, of templates of acme, globex,
    none and no template, with tenants acme, globex, hooli and none; some unsalted, beginning with
    one of three first blocks (the salt audit's)."""
    owners = ("acme", "globex", "")
    servers = [
        Server.objects.create(name=f"vllm-{t or 'shared'}", base_url=f"http://{t}:8000", tenant=t)
        for t in owners
    ]
    templates: list[Template | None] = [
        Template.objects.create(name=f"tpl-{t or 'shared'}", tenant=t) for t in owners
    ]
    templates.append(None)
    tenants = ("acme", "globex", "hooli", "")
    records, diagnoses = [], []
    for n in range(RECORDS):
        at = START + n * timedelta(minutes=7, seconds=13)
        key = {
            "server": servers[n % 3],
            "request_id": f"r{n}",
            "arrived_at": at,
            "tenant": tenants[n // 5 % 4],
            "template": templates[n % 4],
        }
        records.append(
            RequestRecord(
                **key,
                source="rest",
                prompt_tokens=1000 + n,
                cached_tokens=None if n % 11 == 0 else 10 * n,
                client_ttft_seconds=0.01 * n,
                server_ttft_seconds=0.005 * n,
                block_hashes=[n % 3 - 1, n],
                salt_hash="" if n % 2 else "s1",
            )
        )
        diagnoses.append(
            RequestDiagnosis(
                **key,
                diagnosed_at=at,
                prompt_tokens=1000 + n,
                reused_tokens=10 * n,
                evicted_tokens=n,
                salt_tokens=2 * (n % 5),
                unexpected_hit=n % 13 == 0,
                unknown="" if n % 17 else RequestDiagnosis.Unknown.NO_CACHED_TOKENS,
            )
        )
    ensure_day_partitions(RequestRecord, [r.arrived_at for r in records])
    ensure_day_partitions(RequestDiagnosis, [r.arrived_at for r in records])
    RequestRecord.objects.bulk_create(records)
    RequestDiagnosis.objects.bulk_create(diagnoses)


def _served_servers() -> None:
    """Three servers' /metrics pulls and KV events: a shared one, acme's, and a proposed one."""
    a_served_server("metrics-shared")
    acme, _ = a_served_server("metrics-acme")
    proposed, _ = a_served_server("metrics-proposed")
    Server.objects.filter(pk=acme.pk).update(tenant="acme")
    Server.objects.filter(pk=proposed.pk).update(state=Server.State.PROPOSED)


def _refresh_all() -> None:
    refresh_minute_rollups(since=START, until=END)
    refresh_loss_minutes(since=START, until=END)
    now = datetime.now(UTC)
    refresh_server_minutes(since=now - timedelta(hours=2), until=now)


@pytest.fixture
def summed() -> None:
    _stored_traffic()
    _served_servers()
    _refresh_all()
    assert all(rollup.model._default_manager.exists() for rollup in ROLLUPS), "a table has no rows to check"


# --- what a table holds -------------------------------------------------------------------------


def _period(rollup: Rollup, moment: datetime) -> datetime:
    moment = moment.replace(second=0, microsecond=0)
    if rollup.level == Level.HOUR:
        return moment.replace(minute=0)
    if rollup.level == Level.QUARTER:
        return moment.replace(minute=moment.minute - moment.minute % 15)
    return moment


def _combined(rollup: Rollup, column: str, rows: list[dict[str, Any]]) -> Any:
    """One column of the rows of one group, combined as the catalog declares."""
    values = [row[column] for row in rows]
    if column in rollup.latest:
        return max(rows, key=lambda row: tuple(row[c] for c in rollup.latest_by))[column]
    if column in rollup.maxima:
        present = [value for value in values if value is not None]
        return max(present) if present else None
    if isinstance(values[0], list):
        if not any(values):
            return []
        return [sum(value[i] for value in values if value) for i in range(max(len(v) for v in values))]
    if isinstance(values[0], dict):
        merged: dict[str, int] = defaultdict(int)
        for value in values:
            for index, count in value.items():
                merged[index] += count
        return dict(merged)
    return sum(values)


def _summed_apart(rollup: Rollup) -> dict[tuple[Any, ...], dict[str, Any]]:
    """`rollup`'s rows as its source's rows summed in Python, by key and period."""
    assert rollup.source is not None
    source_period = rollup_of(rollup.source).level.column
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rollup.source._default_manager.values():
        if any(row[key] is None and not rollup.model._meta.get_field(key).null for key in rollup.keys):
            continue  # a per-template table holds no requests of no template
        groups[(*(row[key] for key in rollup.keys), _period(rollup, row[source_period]))].append(row)
    return {key: {c: _combined(rollup, c, rows) for c in _measured(rollup)} for key, rows in groups.items()}


def _measured(rollup: Rollup) -> list[str]:
    skipped = {*rollup.keys, rollup.level.column, "id"}
    return [str(f.attname) for f in rollup.model._meta.concrete_fields if f.attname not in skipped]


def _stored(rollup: Rollup) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {
        (*(row[key] for key in rollup.keys), row[rollup.level.column]): {c: row[c] for c in _measured(rollup)}
        for row in rollup.model._default_manager.values()
    }


def _snapshot() -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    return {rollup.name: _stored(rollup) for rollup in ROLLUPS}


def _assert_same(
    stored: dict[tuple[Any, ...], dict[str, Any]], expected: dict[tuple[Any, ...], dict[str, Any]]
) -> None:
    """The same rows, floats to rounding (a sum's order is the database's)."""
    assert set(stored) == set(expected)
    for key, row in stored.items():
        assert row == {
            c: pytest.approx(v) if isinstance(v, float) else v for c, v in expected[key].items()
        }, key


@pytest.mark.parametrize("rollup", DERIVED, ids=lambda rollup: rollup.name)
def test_each_derived_table_is_the_table_it_sums_summed_apart(summed: None, rollup: Rollup) -> None:
    _assert_same(_stored(rollup), _summed_apart(rollup))


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def test_the_first_level_tables_are_the_records_and_diagnoses_summed_apart(summed: None) -> None:
    requests: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0, 0])
    for record in RequestRecord.objects.all():
        found = requests[(record.server_id, record.template_id, _minute(record.arrived_at))]
        found[0] += 1
        found[1] += record.prompt_tokens or 0
        found[2] += record.cached_tokens or 0
    assert {
        (row.server_id, row.template_id, row.minute): [row.requests, row.prompt_tokens, row.cached_tokens]
        for row in MinuteRollup.objects.all()
    } == requests
    losses: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for d in RequestDiagnosis.objects.all():
        found = losses[(d.server_id, d.template_id, d.template_version_id, d.tenant, _minute(d.arrived_at))]
        for i, value in enumerate((1, d.unknown == "", d.reused_tokens, d.evicted_tokens, d.salt_tokens)):
            found[i] += value
    stored = {
        (row.server_id, row.template_id, row.template_version_id, row.tenant, row.minute): [
            row.requests,
            row.diagnosed,
            row.reused_tokens,
            row.evicted_tokens,
            row.salt_tokens,
        ]
        for row in LossMinute.objects.all()
    }
    assert stored == losses


def test_a_late_record_moves_every_table_of_its_minute_and_a_rerun_changes_nothing(summed: None) -> None:
    before = _snapshot()
    _refresh_all()
    for name, rows in _snapshot().items():  # a rerun converges on the same rows
        _assert_same(rows, before[name])

    late = START + timedelta(hours=3, minutes=2, seconds=30)  # into an hour and a quarter already summed
    server = Server.objects.get(name="vllm-acme")
    key = {"server": server, "request_id": "late", "arrived_at": late, "tenant": "acme", "template": None}
    RequestRecord.objects.create(**key, source="rest", prompt_tokens=500, cached_tokens=100)
    RequestDiagnosis.objects.create(**key, diagnosed_at=late, prompt_tokens=500, reused_tokens=100)
    refresh_minute_rollups(since=late, until=late)
    refresh_loss_minutes(since=late, until=late)

    for rollup in ROLLUPS:
        if rollup.owner == Owner.SERVER or "first_block" in rollup.keys:
            continue  # a server's own readings and the salt audit hold no such record
        if rollup.source is not None:
            _assert_same(_stored(rollup), _summed_apart(rollup))
        moved = [
            row
            for key_, row in _stored(rollup).items()
            if key_[-1] == _period(rollup, late) and (rollup.keys[:1] != ("template_id",))
        ]
        if moved:  # a per-template table holds no request of no template
            assert (
                sum(row["requests"] for row in moved)
                == sum(
                    row["requests"]
                    for key_, row in before[rollup.name].items()
                    if key_[-1] == _period(rollup, late)
                )
                + 1
            ), rollup.name


# --- who reads it --------------------------------------------------------------------------------


def _may_see(viewer: Viewer, rollup: Rollup, row: dict[str, Any]) -> bool:
    """app/core/tenancy.py's rules, row by row."""
    if viewer.tenants is None:
        return True
    tenants = viewer.tenants
    if not tenants:
        return False  # a user of no tenant sees nothing, a shared server's readings neither
    if rollup.owner == Owner.SERVER:
        server = Server.objects.get(pk=row["server_id"])
        return server.tenant in tenants or (server.tenant == "" and server.state != Server.State.PROPOSED)
    owners: dict[tuple[str, Any], str] = {
        **{("server_id", pk): tenant for pk, tenant in Server.objects.values_list("pk", "tenant")},
        **{("template_id", pk): tenant for pk, tenant in Template.objects.values_list("pk", "tenant")},
    }
    owned = any(owners.get((key, row.get(key)), "") in tenants for key in ("server_id", "template_id"))
    if "tenant" in row:
        return row["tenant"] in tenants or (row["tenant"] == "" and owned)
    return owned


def _template_seen(viewer: Viewer, template_id: int | None) -> bool:
    if viewer.tenants is None:
        return True
    owners = dict(Template.objects.values_list("pk", "tenant"))
    return template_id in owners and owners[template_id] in {*viewer.tenants, ""}


def _numbers(rollup: Rollup) -> list[str]:
    """The columns summed plainly (the ones a reader adds up across rows)."""
    numbers = [
        f.attname for f in rollup.model._meta.concrete_fields if isinstance(f, IntegerField | FloatField)
    ]
    return [c for c in _measured(rollup) if c in numbers and c not in rollup.maxima]


def _totals(rows: Iterable[dict[str, Any]], columns: list[str]) -> dict[str, float]:
    found = dict.fromkeys(columns, 0.0)
    for row in rows:
        for column in columns:
            found[column] += row[column]
    return found


def _read(viewer: Viewer, rollup: Rollup) -> list[dict[str, Any]]:
    """What a reader of `rollup` gets for this viewer: the rows it sees, and where the table sums
    its source over fewer keys, the source's rows those do not hold."""
    rows: QuerySet[Model] = rollup.model._default_manager.all()
    if rollup.source is None or set(rollup.keys) == set(rollup_of(rollup.source).keys):
        return list(visible(viewer, rows).values())
    return [
        row
        for part in visible_sums(viewer, rows, rollup.source._default_manager.all())
        for row in part.values()
    ]


@pytest.mark.parametrize("viewer", VIEWERS.values(), ids=VIEWERS.keys())
@pytest.mark.parametrize("rollup", ROLLUPS, ids=lambda rollup: rollup.name)
def test_each_viewer_reads_the_sum_of_what_it_may_see(summed: None, rollup: Rollup, viewer: Viewer) -> None:
    columns = _numbers(rollup)
    base = rollup if rollup.source is None else rollup_of(rollup.source)
    # A sum of its source over servers, per template, answers per-template reads: of templates seen.
    per_template = (
        set(rollup.keys) < set(base.keys) and "template_id" in rollup.keys and "server_id" not in rollup.keys
    )
    seen = [
        row
        for row in base.model._default_manager.values()
        if _may_see(viewer, base, row)
        and (not per_template or _template_seen(viewer, row["template_id"]))
        and not (per_template and row["template_id"] is None)
    ]
    assert _totals(_read(viewer, rollup), columns) == pytest.approx(_totals(seen, columns))
    if viewer is SEES_NOTHING:
        assert _read(viewer, rollup) == []


def test_rollup_sql_prints_what_the_refresh_runs_for_a_migration_to_paste() -> None:
    out = StringIO()
    call_command("rollup_sql", "ServerLossHour", stdout=out)
    assert out.getvalue().startswith("DELETE FROM traffic_serverlosshour WHERE hour >= %(since)s")
    assert "FROM traffic_losshour WHERE hour >= %(since)s" in out.getvalue()
    with pytest.raises(CommandError, match="one of: HourRollup"):
        call_command("rollup_sql", "MinuteRollup")  # summed from raw rows, by hand
