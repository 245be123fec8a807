"""The refresh of a derived sum table, written from its catalog entry: its rows of a window emptied
and summed again from the table it sums, so a rerun (or one overlapping late rows) converges on the
same rows, and a group with nothing left in it loses its row.

Migrations never import this (app code changes after a migration is written): a migration that
creates or backfills a derived table pastes the SQL `manage.py rollup_sql NAME` prints.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

from django.contrib.postgres.fields import ArrayField
from django.db.backends.utils import CursorWrapper
from django.db.models import JSONField

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.rollups.catalog import Level, Rollup, rollup_of
from app.rollups.sketch_sql import summed_sketches_sql, with_sketches

HISTOGRAM_LENGTH = len(TTFT_BUCKETS_SECONDS) + 1  # every array summed is a TTFT histogram, +Inf last
_EPOCH = "TIMESTAMPTZ '2000-01-01'"  # where quarter hours are counted from (:00, :15, :30, :45)


@dataclass(frozen=True, slots=True)
class Statements:
    delete: str
    insert: str


def _period(rollup: Rollup) -> str:
    """The expression of `rollup`'s period over its source's rows."""
    assert rollup.source is not None
    column = rollup_of(rollup.source).level.column
    if rollup_of(rollup.source).level == rollup.level:
        return column
    if rollup.level == Level.QUARTER:
        return f"date_bin('15 minutes', {column}, {_EPOCH})"
    return f"date_trunc('{rollup.level.column}', {column})"


def _histogram(column: str) -> str:
    """Cumulative bucket counts summed position by position; '{}' where no row had any."""
    positions = ", ".join(f"coalesce(sum({column}[{i}]), 0)" for i in range(1, HISTOGRAM_LENGTH + 1))
    return f"CASE WHEN bool_or(cardinality({column}) > 0) THEN ARRAY[{positions}] ELSE '{{}}' END"


def _measures(rollup: Rollup) -> dict[str, str]:
    """{column: its aggregate over the source's rows} of every column the table sums."""
    skipped = {*rollup.keys, rollup.level.column, "id"}
    latest = ", ".join(f"{column} DESC" for column in rollup.latest_by)
    found = {}
    for field in rollup.model._meta.concrete_fields:
        column = str(field.column)
        if column in skipped or isinstance(field, JSONField):  # JSON: the sketches, merged apart
            continue
        if column in rollup.latest:
            found[column] = f"(array_agg({column} ORDER BY {latest}))[1]"
        elif column in rollup.maxima:
            found[column] = f"max({column})"
        elif isinstance(field, ArrayField):
            found[column] = _histogram(column)
        else:
            found[column] = f"sum({column})"
    return found


def _where(rollup: Rollup) -> str:
    """The source rows a derived table sums: those of its window, and none of a key it cannot hold
    (a per-template table has no row for the requests of no template)."""
    assert rollup.source is not None
    column = rollup_of(rollup.source).level.column
    found = [f"{column} >= %(since)s", f"{column} < %(until)s"]
    for key in rollup.keys:
        if rollup.source._meta.get_field(key).null and not rollup.model._meta.get_field(key).null:
            found.append(f"{key} IS NOT NULL")
    return " AND ".join(found)


@cache
def statements(rollup: Rollup, *, sketches: bool = True) -> Statements:
    """The DELETE and the INSERT that sum `rollup` again over a window (%(since)s, %(until)s: whole
    periods of the table); without `sketches` its TTFT sketches are left empty (the benchmark's baseline)."""
    assert rollup.source is not None, f"{rollup.name} is summed from raw rows, by hand"
    period = rollup.level.column
    keys = {**{key: key for key in rollup.keys}, period: _period(rollup)}
    measures, source, where = _measures(rollup), rollup.source._meta.db_table, _where(rollup)
    grouped = ", ".join(str(n) for n in range(1, len(keys) + 1))
    totals = f"""
SELECT {", ".join(f"{expr} AS {name}" for name, expr in keys.items())}, {", ".join(measures.values())}
FROM {source} WHERE {where}
GROUP BY {grouped}"""
    columns = ", ".join([*keys, *measures])
    delete = f"DELETE FROM {rollup.table} WHERE {period} >= %(since)s AND {period} < %(until)s"
    if not rollup.sketches:
        return Statements(delete, f"INSERT INTO {rollup.table} ({columns}){totals}")
    insert = f"INSERT INTO {rollup.table} ({columns}, client_ttft_sketch, server_ttft_sketch)"
    found = summed_sketches_sql(table=source, keys=keys, where=where) if sketches else None
    return Statements(delete, with_sketches(insert=insert, totals=totals, sketches=found, keys=tuple(keys)))


def whole_periods(level: Level, since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """[since, until) widened to whole periods of `level`, so that a period is never half-counted."""
    return _floor(level, since), _ceil(level, until)


def _floor(level: Level, moment: datetime) -> datetime:
    moment = moment.replace(second=0, microsecond=0)
    if level == Level.HOUR:
        return moment.replace(minute=0)
    if level == Level.QUARTER:
        return moment.replace(minute=moment.minute - moment.minute % 15)
    return moment


def _ceil(level: Level, moment: datetime) -> datetime:
    floor = _floor(level, moment)
    width = {Level.MINUTE: timedelta(minutes=1), Level.QUARTER: timedelta(minutes=15)}
    return floor if floor == moment else floor + width.get(level, timedelta(hours=1))


def resum(
    rollup: Rollup, cursor: CursorWrapper, *, since: datetime, until: datetime, sketches: bool = True
) -> None:
    """Sum `rollup` again over the whole periods touching [since, until)."""
    start, end = whole_periods(rollup.level, since, until)
    sql = statements(rollup, sketches=sketches)
    cursor.execute(sql.delete, {"since": start, "until": end})
    cursor.execute(sql.insert, {"since": start, "until": end})
