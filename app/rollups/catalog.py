"""Every sum table, declared once: what it is keyed by, at which period, and what it sums.

A first-level table is summed from raw rows by a hand-written refresh (app/rollups/refresh.py,
servers.py: histograms, prefill regressions, the salt audit's first blocks hold real logic). A
derived table sums another sum table: its refresh (app/rollups/derived.py), its visibility to a
viewer (app/rollups/visibility.py) and its contract test (tests/rollups/test_contract.py) all follow
from its entry here. What a derived table sums is its model's columns: every number summed, every
array (a TTFT histogram) summed position by position, the TTFT sketches merged index by index, with
`maxima` and `latest` the exceptions. So a new number in a Totals base is summed at every level.

Which table answers "a week of one template for one tenant"? The one keyed by (template, tenant) at
the hour: TemplateLossHour. Read a catalog entry's `keys` and `level`.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from django.db.models import Model

from app.traffic.models import (
    HourRollup,
    LossHour,
    LossMinute,
    MinuteRollup,
    ServerHour,
    ServerLossHour,
    ServerLossMinute,
    ServerLossQuarter,
    ServerMinute,
    ServerRequestHour,
    ServerRequestMinute,
    TemplateLossHour,
    TemplateRequestHour,
    UnsaltedPrefixHour,
    UnsaltedPrefixMinute,
)


class Level(Enum):
    """A sum table's period: its time column and how wide one of its rows is."""

    MINUTE = ("minute", "1 minute")
    QUARTER = ("minute", "15 minutes")  # the quarter's first minute, in a `minute` column
    HOUR = ("hour", "1 hour")

    def __init__(self, column: str, width: str) -> None:
        self.column = column
        self.width = width


class Owner(Enum):
    """Whose rows a table holds, so who may read them (app/core/tenancy.py states the rules)."""

    TRAFFIC = "traffic"  # requests' sums: a tenant's, or its server's or template's owner's
    SERVER = "server"  # a server's own readings (/metrics, KV events): whoever sees the server


@dataclass(frozen=True, slots=True)
class Rollup:
    model: type[Model]
    level: Level
    keys: tuple[str, ...]  # the columns a row is one of, besides its period
    source: type[Model] | None = None  # the sum table it sums; None: raw rows (a first-level table)
    owner: Owner = Owner.TRAFFIC
    maxima: tuple[str, ...] = ()  # columns taken as the greatest of the rows summed
    latest: tuple[str, ...] = ()  # columns taken from the latest row summed (by `latest_by`)
    latest_by: tuple[str, ...] = ()  # the latest row: the greatest by these columns, in order
    sketches: bool = False  # client_ttft_sketch and server_ttft_sketch merged index by index

    @property
    def table(self) -> str:
        return self.model._meta.db_table

    @property
    def name(self) -> str:
        return self.model.__name__


_RECORD = ("server_id", "template_id")
_DIAGNOSIS = ("server_id", "template_id", "template_version_id", "tenant")
_PREFIX = ("model", "first_block", "tenant", "template_id")
LATEST_PREFIX_BY = ("last_seen_at", "last_server_id", "last_request_id")  # one rule for "the latest"

# In refresh order: a table comes after the table it sums.
ROLLUPS = (
    # Request records: per server and template, per server (the Fleet page), per template (Templates).
    Rollup(MinuteRollup, Level.MINUTE, _RECORD, sketches=True),
    Rollup(ServerRequestMinute, Level.MINUTE, ("server_id",), source=MinuteRollup, sketches=True),
    Rollup(HourRollup, Level.HOUR, _RECORD, source=MinuteRollup, sketches=True),
    Rollup(ServerRequestHour, Level.HOUR, ("server_id",), source=HourRollup, sketches=True),
    Rollup(TemplateRequestHour, Level.HOUR, ("template_id",), source=HourRollup, sketches=True),
    # Diagnoses: the funnel and the lost tokens per cause, per tenant always.
    Rollup(LossMinute, Level.MINUTE, _DIAGNOSIS),
    Rollup(ServerLossMinute, Level.MINUTE, ("server_id", "tenant"), source=LossMinute),
    Rollup(LossHour, Level.HOUR, _DIAGNOSIS, source=LossMinute),
    Rollup(ServerLossHour, Level.HOUR, ("server_id", "tenant"), source=LossHour),
    Rollup(TemplateLossHour, Level.HOUR, ("template_id", "tenant"), source=LossHour),
    Rollup(ServerLossQuarter, Level.QUARTER, ("server_id", "tenant"), source=LossMinute),
    # A server's own readings: its /metrics pulls and the blocks its KV events removed.
    Rollup(ServerMinute, Level.MINUTE, ("server_id",), owner=Owner.SERVER),
    Rollup(
        ServerHour,
        Level.HOUR,
        ("server_id",),
        source=ServerMinute,
        owner=Owner.SERVER,
        maxima=("kv_usage_max",),
    ),
    # The salt audit: the first blocks unsalted requests of a tenant sent, two of them or more an hour.
    Rollup(UnsaltedPrefixMinute, Level.MINUTE, _PREFIX, maxima=("last_seen_at",)),
    Rollup(
        UnsaltedPrefixHour,
        Level.HOUR,
        _PREFIX,
        source=UnsaltedPrefixMinute,
        maxima=("last_seen_at",),
        latest=("last_server_id", "last_request_id"),
        latest_by=LATEST_PREFIX_BY,
    ),
)

_BY_MODEL = {rollup.model: rollup for rollup in ROLLUPS}
_BY_TABLE = {rollup.table: rollup for rollup in ROLLUPS}


def rollup_of(model: type[Model]) -> Rollup:
    """The catalog's entry for a sum table's model; KeyError for a table that is no sum."""
    return _BY_MODEL[model]


def table_rollup(table: str) -> Rollup:
    """The catalog's entry for a sum table named as in SQL; KeyError for a table that is no sum."""
    return _BY_TABLE[table]


def derived_from(model: type[Model]) -> Iterator[Rollup]:
    """The derived tables that sum `model`, directly or through another, in refresh order."""
    summed = {model}
    for rollup in ROLLUPS:
        if rollup.source in summed:
            summed.add(rollup.model)
            yield rollup
